"""The text of ``report.md``: its content as data, the sentences of its sections and its
Markdown cells, rendered by the Jinja2 template ``report/templates/report.md.j2``."""
