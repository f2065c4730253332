"""Reference points computed from the tokenized data (``<tokens_dir>/<dataset>/``), against
which the report reads every loss and score: ``references.csv`` (:func:`reference_table`) and
the loss at initialisation (:func:`uniform_losses`). The statistics are in
:mod:`lmablate.report.stats.reference_models` and :mod:`lmablate.report.stats.arithmetic_tables`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lmablate.config.study import StudyConfig
from lmablate.data.tokenizer import load_split, load_tokenizer
from lmablate.report.collect import BASELINE, RunOutputs
from lmablate.report.stats import reference_models as refs
from lmablate.report.stats import arithmetic_tables as arith

REFERENCE_COLUMNS = ["dataset", "reference", "metric", "value", "detail"]


def reference_table(cfg: StudyConfig, tokens_dir: Path, runs: RunOutputs) -> pd.DataFrame:
    """One row per dataset x reference x metric (columns :data:`REFERENCE_COLUMNS`).

    * Every dataset: the n-gram cross-entropies (nats/char, metric ``test_loss``) of its test
      split under its train split's counts (:func:`lmablate.report.stats.reference_models.
      ngram_references`; ``detail`` the smoothing).
    * Arithmetic: answers that ignore the question, scored on the baseline's first seed's
      decoded test targets, and the answer-position floor from the train split's answers
      (:func:`lmablate.report.stats.arithmetic_tables.answer_references`).

    Raises:
        FileNotFoundError / TokenizerError: a dataset's tokens are missing under ``tokens_dir``.
        DataError: an arithmetic train split does not cut into problems of its ``line_length``.
    """
    rows = []
    for dataset, ds in cfg.datasets.items():
        tok = load_tokenizer(tokens_dir / dataset)
        train, test = (np.asarray(load_split(tokens_dir / dataset, s)) for s in ("train", "test"))
        rows += [{"dataset": dataset, "reference": name, "metric": "test_loss", "value": value,
                  "detail": refs.NGRAM_SMOOTHING}
                 for name, value in refs.ngram_references(train, test, tok.vocab_size).items()]
        first = next((v for v in (runs.predictions.get((dataset, BASELINE)) or {}).values() if v),
                     None)
        if ds.kind == "arithmetic" and first:
            rows += arith.answer_references(dataset, tokens_dir / dataset,
                                            [str(p["target"]) for p in first])
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS)


def uniform_losses(cfg: StudyConfig, tokens_dir: Path | None) -> dict[str, float]:
    """dataset -> ``ln(vocab_size)`` in nats/char, the loss of the uniform prediction
    (:func:`lmablate.report.stats.reference_models.uniform_cross_entropy`), the vocabulary read
    as :func:`reference_table` reads it; empty when ``tokens_dir`` is None. Raises
    FileNotFoundError / TokenizerError where a dataset's tokenizer is missing."""
    if tokens_dir is None:
        return {}
    return {ds: refs.uniform_cross_entropy(load_tokenizer(Path(tokens_dir) / ds).vocab_size)
            for ds in cfg.datasets}
