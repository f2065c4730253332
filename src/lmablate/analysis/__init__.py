"""The study's analysis, one job per module; the ``report`` stage (lmablate.stages.report) runs it.

* :mod:`~lmablate.analysis.collect`: read ``runs/`` into ``RunOutputs``, in the study order.
* :mod:`~lmablate.analysis.statistics`: t-intervals over seeds, paired t-tests, Holm's correction.
* :mod:`~lmablate.analysis.sensitivity`: how each variant responds to the learning rate and the
  width, from its tuning trials (the learning-rate sensitivity of Wortsman et al. 2023).
* :mod:`~lmablate.analysis.headline`: each dataset's headline loss (answer loss on arithmetic),
  and the DVC metrics and verdicts stated in it.
* :mod:`~lmablate.analysis.arithmetic`: the arithmetic section: the headline against its floors,
  length generalisation by operand digits (tables, comparisons, text).
* :mod:`~lmablate.analysis.limits`: what the study can and cannot say (the tuning luck among it).
* The seaborn figures, one ``plot_*`` function each, as PNG: :mod:`~lmablate.analysis.figures`
  (losses, comparisons, gradients), :mod:`~lmablate.analysis.tuning_figure`,
  :mod:`~lmablate.analysis.model_figures` (attention, embeddings) and
  :mod:`~lmablate.analysis.arithmetic_figures`, on :mod:`~lmablate.analysis.plotting` (the
  figure, variant colours, units).
* :mod:`~lmablate.analysis.markdown`: the text of ``report.md`` from the tables and the config.
* What the report stage calls: :mod:`~lmablate.analysis.tables` (every table from the runs,
  with :mod:`~lmablate.analysis.reference_points`), :mod:`~lmablate.analysis.report_figures`
  (every figure with its caption) and :mod:`~lmablate.analysis.report_text` (``report.md``).
"""
