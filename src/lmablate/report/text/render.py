"""``report.md`` and ``appendix.md`` rendered from the content model
(:mod:`lmablate.report.text.content`) by the templates ``report.md.j2`` and ``appendix.md.j2``,
which own the section order, headings, fixed paragraphs and figure blocks.
"""

from __future__ import annotations

from lmablate.report.text.content import ReportContent
from lmablate.report.text.templating import environment

TEMPLATE = "report.md.j2"
APPENDIX_TEMPLATE = "appendix.md.j2"  # the detail report.md links to


def render_report(content: ReportContent, template: str = TEMPLATE) -> str:
    """The text of ``report.md`` (GitHub-flavoured Markdown, ``\\n`` line ends, one final
    newline).

    Raises:
        jinja2.UndefinedError: the template uses a field the content does not have.
        jinja2.TemplateNotFound: no ``template`` in the package's templates.
    """
    return environment().get_template(template).render(report=content).rstrip() + "\n"


def render_appendix(content: ReportContent) -> str:
    """The text of ``appendix.md`` (how the learning rate was chosen, each dataset's tuning
    detail, samples and predictions), formatted as :func:`render_report`.

    Raises:
        jinja2.UndefinedError: the template uses a field the content does not have.
    """
    return render_report(content, APPENDIX_TEMPLATE)
