"""Reference points from the tokenized data (``<tokens_dir>/<dataset>/``) against which the
report reads every loss and score: ``references.csv`` and the loss at initialisation."""

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
    """Per dataset x reference x metric (:data:`REFERENCE_COLUMNS`): the test split's n-gram
    cross-entropies, nats/char (:mod:`lmablate.report.stats.reference_models`), and on arithmetic
    :func:`lmablate.report.stats.arithmetic_tables.answer_references`. Raises FileNotFoundError
    / TokenizerError (tokens missing), DataError (a train split not cut into problems)."""
    rows = []
    for dataset, ds in cfg.datasets.items():
        tok = load_tokenizer(tokens_dir / dataset)
        train, test = (np.asarray(load_split(tokens_dir / dataset, s)) for s in ("train", "test"))
        rows += [{"dataset": dataset, "reference": name, "metric": "test_loss", "value": value,
                  "detail": refs.NGRAM_SMOOTHING}
                 for name, value in refs.ngram_references(train, test, tok.vocab_size).items()]
        first = next(filter(None, (runs.predictions.get((dataset, BASELINE)) or {}).values()), None)
        if ds.kind == "arithmetic" and first:
            rows += arith.answer_references(dataset, tokens_dir / dataset,
                                            [str(p["target"]) for p in first])
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS)


def uniform_losses(cfg: StudyConfig, tokens_dir: Path | None) -> dict[str, float]:
    """dataset -> the uniform prediction's loss ``ln(vocab_size)``, nats/char; empty when
    ``tokens_dir`` is None. Raises FileNotFoundError / TokenizerError (tokenizer missing)."""
    if tokens_dir is None:
        return {}
    return {ds: refs.uniform_cross_entropy(load_tokenizer(Path(tokens_dir) / ds).vocab_size)
            for ds in cfg.datasets}
