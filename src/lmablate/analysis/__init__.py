"""The study's analysis, one job per module; the ``report`` stage (lmablate.stages.report) runs it.

Every module, one line each (``tests/test_docstrings.py`` checks that none is left out):

* :mod:`~lmablate.analysis.collect`: read ``runs/`` into ``RunOutputs``, in the study order.
* :mod:`~lmablate.analysis.run_files`: one stage file (metrics, CSV, best.json) read into rows.
* :mod:`~lmablate.analysis.families`: which part of the model a variant changes; its colours.
* :mod:`~lmablate.analysis.statistics`: t-intervals over seeds, paired tests, Holm's correction.
* :mod:`~lmablate.analysis.pooled_uncertainty`: tuning uncertainty with a dataset's pooled spread.
* :mod:`~lmablate.analysis.problems`: arithmetic variants against the baseline problem by problem.
* :mod:`~lmablate.analysis.success`: which seeds learned arithmetic; their share, exact interval.
* :mod:`~lmablate.analysis.learning_speed`: tokens until each seed learns; Kaplan-Meier, sign test.
* :mod:`~lmablate.analysis.extrapolation`: each position scheme's loss past its training context.
* :mod:`~lmablate.analysis.sensitivity`: each variant's response to lr and width, from its trials.
* :mod:`~lmablate.analysis.scaling`: loss against compute fitted; each effect's trend with it.
* :mod:`~lmablate.analysis.isoflop`: loss against width at equal compute; compute-optimal width.
* :mod:`~lmablate.analysis.headline`: each dataset's headline loss, DVC metrics and verdicts.
* :mod:`~lmablate.analysis.arithmetic`: arithmetic's headline, floors and length generalisation.
* :mod:`~lmablate.analysis.curves`: the mean validation curves that ``dvc plots show`` draws.
* :mod:`~lmablate.analysis.plotting`: what every figure shares: the figure, colours, units.
* :mod:`~lmablate.analysis.figures`: the figures of losses, comparisons and gradients (PNG).
* :mod:`~lmablate.analysis.tuning_figure`: loss against learning rate and width, from tuning.
* :mod:`~lmablate.analysis.bracket_figure`: each variant's full-budget lr bracket: figure, table.
* :mod:`~lmablate.analysis.model_figures`: attention maps and token embeddings of a model.
* :mod:`~lmablate.analysis.arithmetic_figures`: arithmetic by operation and by operand length.
* :mod:`~lmablate.analysis.scaling_figures`: curves, effects and isoFLOP profiles against compute.
* :mod:`~lmablate.analysis.mdtable`: Markdown cells and tables: numbers, intervals, verdicts.
* :mod:`~lmablate.analysis.findings`: the report's "Findings": verdicts, what is undecided.
* :mod:`~lmablate.analysis.methods`: the report's "Methodology", from config and environment.
* :mod:`~lmablate.analysis.lr_section`: the report's section on the learning-rate response.
* :mod:`~lmablate.analysis.limits`: the report's "What this study can and cannot say".
* :mod:`~lmablate.analysis.scaling_section`: the report's "How the effects change with compute".
* :mod:`~lmablate.analysis.markdown`: the text of ``report.md``, assembled from the sections.
* :mod:`~lmablate.analysis.tables`: every table the report computes from the runs, and its CSV.
* :mod:`~lmablate.analysis.reference_points`: n-gram, constant-answer and uniform reference losses.
* :mod:`~lmablate.analysis.report_figures`: every figure of the report, with its caption.
* :mod:`~lmablate.analysis.report_text`: the text of ``report.md`` around the sections.
"""
