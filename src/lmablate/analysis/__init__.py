"""The study's analysis, one job per module (the ``report`` stage, :mod:`lmablate.stages.report`, runs them).

* :mod:`~lmablate.analysis.collect`: read ``runs/<dataset>/<variant>/`` into :class:`~lmablate.analysis.collect.RunOutputs`, in study order.
* :mod:`~lmablate.analysis.statistics`: Student-t intervals over seeds, paired t-tests against the baseline, Holm's correction.
* :mod:`~lmablate.analysis.figures`: the seaborn figures, one ``plot_*`` function each, written as PNG.
* :mod:`~lmablate.analysis.markdown`: the text of ``report.md`` from the tables, the config and the figures.
"""
