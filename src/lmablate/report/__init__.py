"""The report stage's library: the runs collected into tables, statistics, figures and text; the
``report`` stage (:mod:`lmablate.stages.report`) runs it.

Data flows one way: collected runs, statistics, headline, tables, figures, text; a module
imports only from its own layer or one below (``tests/test_report_layers.py``). Its modules:

* :mod:`~lmablate.report.collect`: read ``runs/`` into ``RunOutputs``, in the study order.
* :mod:`~lmablate.report.run_files`: one stage file (metrics, CSV, best.json) read into rows.
* :mod:`~lmablate.report.families`: which part of the model a variant changes; its colours.
* :mod:`~lmablate.report.headline`: each dataset's headline loss, DVC metrics and verdicts.
* :mod:`~lmablate.report.curves`: the mean validation curves that ``dvc plots show`` draws.
* :mod:`~lmablate.report.tables`: every table the report computes from the runs, and its CSV.
* :mod:`~lmablate.report.staging`: the outputs replaced all at once, through a staging folder.
* :mod:`~lmablate.report.captions`: a figure's caption as data: its template macro and fields.

Statistics (:mod:`~lmablate.report.stats`):

* :mod:`~lmablate.report.stats.statistics`: t-intervals over seeds, paired tests, Holm's correction.
* :mod:`~lmablate.report.stats.pooled_uncertainty`: tuning uncertainty, a dataset's pooled spread.
* :mod:`~lmablate.report.stats.problems`: arithmetic variants against the baseline, per problem.
* :mod:`~lmablate.report.stats.success`: seeds that learned arithmetic; their share, its interval.
* :mod:`~lmablate.report.stats.learning_speed`: tokens until each seed learns; Kaplan-Meier.
* :mod:`~lmablate.report.stats.extrapolation`: each position scheme's loss past its context.
* :mod:`~lmablate.report.stats.sensitivity`: each variant's response to lr and width.
* :mod:`~lmablate.report.stats.scaling`: loss against compute fitted; each effect's trend with it.
* :mod:`~lmablate.report.stats.isoflop`: loss against width at equal compute; compute-optimal width.
* :mod:`~lmablate.report.stats.reference_models`: n-gram models, constant answers, from data.
* :mod:`~lmablate.report.stats.reference_points`: the reference losses of the report.
* :mod:`~lmablate.report.stats.arithmetic_tables`: arithmetic's floors; exact match by length.
* :mod:`~lmablate.report.stats.replication`: each verdict across replicates; their combination.
* :mod:`~lmablate.report.stats.convergence`: whether each validation curve still fell at the end.
* :mod:`~lmablate.report.stats.detectable`: each comparison's minimum detectable effect, as a table.

Figures (:mod:`~lmablate.report.figures`):

* :mod:`~lmablate.report.figures.plotting`: what every figure shares: the figure, colours, units.
* :mod:`~lmablate.report.figures.losses`: the figures of losses, comparisons and gradients (PNG).
* :mod:`~lmablate.report.figures.tuning_figure`: loss against learning rate and width, from tuning.
* :mod:`~lmablate.report.figures.bracket_figure`: each variant's full-budget lr bracket.
* :mod:`~lmablate.report.figures.model_figures`: attention maps and token embeddings of a model.
* :mod:`~lmablate.report.figures.arithmetic_figures`: arithmetic by operation and operand length.
* :mod:`~lmablate.report.figures.scaling_figures`: curves, effects and isoFLOP profiles.
* :mod:`~lmablate.report.figures.replication_figure`: each replicate's Δ and the combined one.
* :mod:`~lmablate.report.figures.report_figures`: every figure of the report, with its caption.

Text (:mod:`~lmablate.report.text`):

* :mod:`~lmablate.report.text.mdtable`: Markdown cells and tables: numbers, intervals, verdicts.
* :mod:`~lmablate.report.text.findings`: the report's "Findings": verdicts, what is undecided.
* :mod:`~lmablate.report.text.methods`: the report's "Methodology", from config and environment.
* :mod:`~lmablate.report.text.arithmetic_section`: arithmetic's headline, breakdown, length text.
* :mod:`~lmablate.report.text.lr_section`: the report's section on the learning-rate response.
* :mod:`~lmablate.report.text.bracket_section`: the full-budget bracket's text and table.
* :mod:`~lmablate.report.text.limits`: the report's "What this study can and cannot say".
* :mod:`~lmablate.report.text.scaling_section`: the report's "How the effects change with compute".
* :mod:`~lmablate.report.text.content`: what ``report.md`` says, as data: the content model.
* :mod:`~lmablate.report.text.dataset_tables`: each dataset's tables in the report, as rows.
* :mod:`~lmablate.report.text.samples`: the samples and decoded problems the report shows.
* :mod:`~lmablate.report.text.templating`: the Jinja2 environment, its filters, one macro's call.
* :mod:`~lmablate.report.text.render`: ``report.md`` and ``appendix.md`` rendered.
* :mod:`~lmablate.report.text.html`: ``report.md`` as one HTML page, its figures inline (MLflow).

The sentences are Jinja2 templates, ``report/templates/``.
"""
