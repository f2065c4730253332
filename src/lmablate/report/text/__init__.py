"""The report's text: its sections and Markdown tables."""
