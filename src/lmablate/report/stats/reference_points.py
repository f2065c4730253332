"""Reference points computed from the data, against which the report reads every loss and score.

``references.csv`` (:func:`reference_table`): the n-gram cross-entropies of each test split, and
on arithmetic the answers that ignore the question and the answer-position floor. The
learning-rate sensitivity takes the loss at initialisation from :func:`uniform_losses`. Both read
the tokenized datasets (``<tokens_dir>/<dataset>/``); the statistics behind them are in
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
    """Reference points computed from the data, one row per dataset x reference x metric.

    * Every dataset: the unigram, bigram and trigram cross-entropy (nats/char) of its test
      split under counts of its train split
      (:func:`lmablate.report.stats.reference_models.ngram_references`, smoothing
      :data:`lmablate.report.stats.reference_models.NGRAM_SMOOTHING`), metric ``test_loss``.
    * Arithmetic: answers that ignore the question, scored on the decoded test problems (the
      baseline's first seed's targets, the same for every variant)
      (:func:`lmablate.report.stats.arithmetic_tables.answer_references`): all zeros, the best
      constant answer for character accuracy (the per-position mode) and for exact match (the most
      frequent answer), metrics ``char_accuracy`` and ``exact_match`` as fractions, ``detail``
      the answer as written (reversed, as the model writes it); and the answer-position floor
      from the train split's answers, metric ``answer_loss`` in nats per answer character.

    Returns:
        Columns :data:`REFERENCE_COLUMNS`.

    Raises:
        FileNotFoundError / TokenizerError: a dataset's tokens are missing under ``tokens_dir``.
        DataError: an arithmetic train split does not cut into problems of its ``line_length``.
    """
    rows = []
    for dataset, ds in cfg.datasets.items():
        tok = load_tokenizer(tokens_dir / dataset)
        train = np.asarray(load_split(tokens_dir / dataset, "train"))
        test = np.asarray(load_split(tokens_dir / dataset, "test"))
        for name, value in refs.ngram_references(train, test, tok.vocab_size).items():
            rows.append({"dataset": dataset, "reference": name, "metric": "test_loss",
                         "value": value, "detail": refs.NGRAM_SMOOTHING})
        by_seed = runs.predictions.get((dataset, BASELINE)) or {}
        first = next((v for v in by_seed.values() if v), None)
        if ds.kind == "arithmetic" and first:
            rows += arith.answer_references(dataset, tokens_dir / dataset,
                                            [str(p["target"]) for p in first])
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS)


def uniform_losses(cfg: StudyConfig, tokens_dir: Path | None) -> dict[str, float]:
    """dataset -> the loss of the uniform prediction over its vocabulary, ``ln(vocab_size)``
    in nats/char (:func:`lmablate.report.stats.reference_models.uniform_cross_entropy`), the
    vocabulary read from the tokenizer under ``tokens_dir`` as :func:`reference_table` reads it;
    empty when ``tokens_dir`` is None.

    Raises:
        FileNotFoundError / TokenizerError: a dataset's tokenizer is missing under
            ``tokens_dir``.
    """
    if tokens_dir is None:
        return {}
    return {ds: refs.uniform_cross_entropy(load_tokenizer(Path(tokens_dir) / ds).vocab_size)
            for ds in cfg.datasets}
