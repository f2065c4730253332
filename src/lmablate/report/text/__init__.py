"""The text of ``report.md``: its sections and Markdown tables."""
