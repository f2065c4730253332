"""The answer probe (lmablate.evaluate.answer_probe): an arithmetic run's answer loss and exact
match on fixed validation problems at every evaluation, its answer loss the run's objective."""

import json
import shutil

import numpy as np
import pytest
import torch

from lmablate.core.validation import DataError
from lmablate.data.arithmetic import split_problem
from lmablate.data.token_data import TokenData
from lmablate.data.tokenizer import load_split, load_tokenizer, split_lines
from lmablate.evaluate.answer_probe import PROBE_PROBLEMS, answer_probe, objective_name
from lmablate.evaluate.metrics import answer_nats, arithmetic_predictions
from lmablate.model.gpt import GPT
from lmablate.model.variants import resolve_model_config
from lmablate.train.loop import objective
from lmablate.train.training import train_model


@pytest.fixture(scope="module")
def arith(make_project, tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("probe"),
                        {"study": {"variants": ["baseline"]}, "train": {"eval_interval": 10}})


def test_a_split_cut_into_lines_round_trips_to_its_tokens(arith):
    tokens = arith.path / "tokens"
    lines = split_lines(tokens, "val")
    assert lines and all(split_problem(line) for line in lines)  # each a problem
    tok = load_tokenizer(tokens)
    assert "".join(lines) == tok.decode(np.asarray(load_split(tokens, "val")))
    assert len({len(line) for line in lines}) == 1  # fixed-width fields: one line length


def test_a_corpus_without_lines_has_no_probe(arith, tmp_path):
    """A text corpus's meta.json has no line_length: no problems, no probe, the validation
    loss its objective."""
    tokens = tmp_path / "tokens"
    shutil.copytree(arith.path / "tokens", tokens)
    meta = json.loads((tokens / "meta.json").read_text())
    del meta["line_length"]
    (tokens / "meta.json").write_text(json.dumps(meta))
    assert split_lines(tokens, "val") == []
    assert answer_probe(tokens, 8, torch.device("cpu")) is None
    assert answer_probe(None, 8, torch.device("cpu")) is None
    assert (objective_name("text"), objective_name("arithmetic")) == (
        "val_loss", "val_answer_loss")


def test_a_split_that_is_not_whole_lines_is_refused(arith, tmp_path):
    tokens = tmp_path / "tokens"
    shutil.copytree(arith.path / "tokens", tokens)
    meta = json.loads((tokens / "meta.json").read_text())
    (tokens / "meta.json").write_text(json.dumps({**meta, "line_length": meta["line_length"] + 1}))
    with pytest.raises(DataError, match="not a whole number of problems"):
        split_lines(tokens, "val")


def test_the_probe_scores_the_first_validation_problems_as_evaluation_does(arith):
    tokens = arith.path / "tokens"
    device = torch.device("cpu")
    probe = answer_probe(tokens, 7, device, n=20)
    assert list(probe.problems) == split_lines(tokens, "val")[:20]
    data = TokenData.load(tokens)
    torch.manual_seed(0)
    model = GPT(resolve_model_config(arith.cfg, "baseline", data.vocab_size, 16))
    model.train()
    got = probe(model)
    assert model.training  # left in the mode it came in
    # the slow path: the evaluate stage's own functions, problem by problem
    tok, problems = probe.tok, list(probe.problems)
    targets = [split_problem(p)[1] for p in problems]
    nats = answer_nats(model, tok, problems, 1, device)
    preds = arithmetic_predictions(model, tok, problems, 1, device, show_progress=False)
    assert got["val_answer_loss"] == pytest.approx(nats.sum() / sum(map(len, targets)),
                                                   rel=1e-5)
    assert got["val_exact_match"] == np.mean([p == t for p, t in zip(preds, targets)])
    assert PROBE_PROBLEMS >= 100  # a fraction with steps of at most 1%


def test_a_probed_run_records_the_probe_and_reports_the_answer_loss_as_its_objective(arith):
    tokens = arith.path / "tokens"
    device = torch.device("cpu")
    data = TokenData.load(tokens)
    model_cfg = resolve_model_config(arith.cfg, "baseline", data.vocab_size, 16)
    seen = []
    result = train_model(model_cfg, arith.cfg.train, data, seed=0, lr=3e-3, steps=30,
                         device=device, on_eval=lambda step, value: seen.append(value),
                         probe=answer_probe(tokens, 64, device))
    assert [r["step"] for r in result.history] == [10, 20, 30]
    assert seen == [r["val_answer_loss"] for r in result.history]
    assert result.objective == result.history[-1]["val_answer_loss"] != result.val_loss
    assert all(0 <= r["val_exact_match"] <= 1 for r in result.history)
    plain = train_model(model_cfg, arith.cfg.train, data, seed=0, lr=3e-3, steps=30,
                        device=device)
    assert "val_answer_loss" not in plain.history[-1]
    assert plain.objective == plain.val_loss == result.val_loss  # the probe changes no step
    assert objective({"val_loss": 2.0}) == 2.0
    assert objective({"val_loss": 2.0, "val_answer_loss": 0.5}) == 0.5
