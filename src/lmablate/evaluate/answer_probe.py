"""The answer probe: how well a model answers a fixed set of validation problems, measured at
every evaluation of an arithmetic run.

The validation loss of a window of problems is dominated by the random digits of each question,
which no model can predict; whether the model calculates shows in the answer alone. So on an
arithmetic dataset every evaluation also scores :data:`PROBE_PROBLEMS` validation problems
(the first of the validation split, the same for every run): their **answer loss**, the
teacher-forced cross-entropy of the answer characters given the question (nats per answer
character, :func:`lmablate.evaluate.metrics.answer_nats`), which is the tuning objective there, and
their **exact match**, the share of greedy-decoded answers that are right
(:func:`lmablate.evaluate.metrics.arithmetic_predictions`), whose course over training says when a
seed learned the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lmablate.data.arithmetic import split_problem
from lmablate.data.tokenizer import CharTokenizer, load_tokenizer, split_lines
from lmablate.evaluate.metrics import answer_nats, arithmetic_predictions

PROBE_PROBLEMS = 256  # validation problems scored at every evaluation: 1/256 of exact match
PROBE_METRICS = ("val_answer_loss", "val_exact_match")  # history columns, MLflow metrics


@dataclass(frozen=True)
class AnswerProbe:
    """Scores a model on fixed ``problems`` (arithmetic lines, ``$(a+b)=answer$``) with the
    tokenizer ``tok``, ``batch_size`` problems at a time, on ``device``."""

    problems: tuple[str, ...]
    tok: CharTokenizer
    batch_size: int
    device: torch.device

    def __call__(self, model) -> dict[str, float]:
        """``{"val_answer_loss": nats per answer character (closing ``$`` included),
        "val_exact_match": fraction}`` of ``model`` on the problems; the model is left in the
        mode it came in.

        Raises:
            Interrupted: the stage was asked to stop.
        """
        problems = list(self.problems)
        was_training = model.training
        model.eval()
        try:
            nats = answer_nats(model, self.tok, problems, self.batch_size, self.device)
            preds = arithmetic_predictions(model, self.tok, problems, self.batch_size,
                                           self.device, show_progress=False)
        finally:
            model.train(was_training)
        targets = [split_problem(p)[1] for p in problems]
        chars = sum(len(t) for t in targets)
        return {"val_answer_loss": float(nats.sum() / chars),
                "val_exact_match": float(np.mean([p == t for p, t in zip(preds, targets)]))}


def objective_name(kind: str, summary: str = "final") -> str:
    """The tuning objective of a dataset of ``kind`` (``datasets.<name>.kind``), as Optuna's
    metric name and ``best.json``'s ``objective``: on ``arithmetic`` the probe's answer loss
    (nats per answer character), ``val_answer_loss`` at the trial's last evaluation or, with
    ``summary`` ``mean`` (``tune.arithmetic_objective``), ``val_answer_loss_mean``, its mean over
    the trial's evaluations; ``val_loss`` (nats/char, last evaluation) otherwise."""
    if kind != "arithmetic":
        return "val_loss"
    return "val_answer_loss_mean" if summary == "mean" else "val_answer_loss"


def answer_probe(tokens_dir: Path | None, batch_size: int, device: torch.device,
                 n: int = PROBE_PROBLEMS) -> AnswerProbe | None:
    """The probe of the dataset tokenized in ``tokens_dir``: its first ``n`` validation
    problems; None for a text corpus (no problems) or without ``tokens_dir``.

    Raises:
        TokenizerError / DataError: as :func:`lmablate.data.tokenizer.split_lines`; DataError: a
            line is not a problem (:func:`lmablate.data.arithmetic.split_problem`).
    """
    if tokens_dir is None:
        return None
    problems = split_lines(Path(tokens_dir), "val")[:n]
    for line in problems:
        split_problem(line)  # each line a problem, or the error names it
    if not problems:
        return None
    return AnswerProbe(tuple(problems), load_tokenizer(Path(tokens_dir)), batch_size, device)
