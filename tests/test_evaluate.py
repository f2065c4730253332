"""Evaluation: batched, cached, threaded greedy decoding equals one problem at a time without a
cache; exact match and character accuracy follow seed 000's definitions; test loss is the mean
cross-entropy over non-overlapping windows."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmablate.config import DataError, ModelConfig
from lmablate.arithmetic import format_problem, split_problem
from lmablate.evaluation import (arithmetic_predictions, arithmetic_scores, extrapolation,
                                 test_loss as windowed_test_loss)
from lmablate.model import GPT
from lmablate.tokenizer import CharTokenizer

ALPHABET = "$()*+-./0123456789="
PROBLEMS = [format_problem(12, "+", 34), format_problem(5, "*", 7), format_problem(9, "-", 10),
            format_problem(1, "/", 4), format_problem("100.25", "+", 1)]


def one_at_a_time(model, tok, problems):
    """Seed 000's loop, greedy: a full forward over the growing sequence per new token."""
    out = []
    for line in problems:
        prompt, target = split_problem(line)
        idx = torch.tensor(tok.encode(prompt), dtype=torch.long)[None]
        new = []
        with torch.no_grad():
            for _ in range(len(target)):
                nxt = model(idx)[0][:, -1].argmax(-1, keepdim=True)
                idx = torch.cat((idx, nxt), 1)
                new.append(int(nxt))
                if new[-1] == tok.token_id("$"):
                    break
        pred = tok.decode(np.array(new))
        out.append(pred + "$" * (len(target) - len(pred)))
    return out


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_batched_cached_decoding_equals_one_at_a_time(position):
    tok = CharTokenizer(ALPHABET)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4,
                            context_length=40, position=position)).eval()
    with torch.no_grad():  # larger weights: outputs that depend on the input, like a trained model
        for p in model.parameters():
            p.mul_(25)
    problems = PROBLEMS * 4
    reference = one_at_a_time(model, tok, problems)
    for batch_size, workers in [(1, 1), (3, 1), (len(problems), 1), (3, 2), (4, 3)]:
        got = arithmetic_predictions(model, tok, problems, batch_size, torch.device("cpu"),
                                     workers=workers)
        assert got == reference, (batch_size, workers)
    assert all(len(p) == 11 for p in reference)
    # not a constant output: the comparison covers varied tokens, and early stops padded by "$"
    assert len({p.rstrip("$") for p in reference}) > 1


def test_predictions_refuse_a_problem_out_of_format_before_decoding():
    tok = CharTokenizer(ALPHABET)
    model = GPT(ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2,
                            context_length=40)).eval()
    with pytest.raises(DataError, match=r"'\$\(1\+2=3\$' is not allowed; expected '\$\(' a op b"):
        arithmetic_predictions(model, tok, [PROBLEMS[0], "$(1+2=3$"], 2, torch.device("cpu"))


def test_scores_follow_seed_000_definitions():
    problems = [format_problem(12, "+", 34), format_problem(5, "*", 7),
                format_problem(9, "-", 10), format_problem(1, "/", 4)]
    targets = [split_problem(p)[1] for p in problems]
    preds = list(targets)
    preds[1] = "x" + targets[1][1:]  # one wrong character of 11
    preds[3] = "$" * 11  # every position wrong but the final "$"
    s = arithmetic_scores(problems, preds)
    assert s["exact_match"] == pytest.approx(2 / 4)
    assert s["char_accuracy"] == pytest.approx((11 + 10 + 11 + 1) / 44)
    assert s["per_op"]["add"] == {"char_accuracy": 1.0, "exact_match": 1.0}
    assert s["per_op"]["mul"]["char_accuracy"] == pytest.approx(10 / 11)
    assert s["per_op"]["mul"]["exact_match"] == 0.0
    assert s["per_op"]["div"]["char_accuracy"] == pytest.approx(1 / 11)


def test_test_loss_is_mean_cross_entropy_over_windows():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=7, d_model=16, n_layers=1, n_heads=2,
                            context_length=8)).eval()
    tokens = np.random.default_rng(0).integers(0, 7, size=8 * 5 + 3).astype(np.uint8)
    got = windowed_test_loss(model, tokens, batch_size=2, max_batches=10, device=torch.device("cpu"))
    windows = torch.from_numpy(tokens[:41].astype(np.int64))
    x, y = windows[:40].view(5, 8), windows[1:41].view(5, 8)
    with torch.no_grad():
        expected = F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten()).item()
    assert got == pytest.approx(expected, rel=1e-5)
    assert got > math.log(7) * 0.5
    with pytest.raises(ValueError, match="need at least 9"):
        windowed_test_loss(model, tokens[:8], 2, 10, torch.device("cpu"))


def _tiny(position: str) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=7, d_model=16, n_layers=1, n_heads=2, context_length=8,
                           position=position)).eval()


@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal", "none"])
def test_extrapolation_is_the_loss_of_every_position_of_longer_windows(position):
    model = _tiny(position)
    tokens = np.random.default_rng(0).integers(0, 7, size=32 * 3 + 5).astype(np.uint8)
    got = extrapolation(model, tokens, (1, 2, 4), bucket=4, batch_size=2, max_tokens=10_000,
                        device=torch.device("cpu"))
    assert list(got) == ["x1", "x2", "x4"]
    for f in (1, 2, 4):
        L = 8 * f
        w = torch.from_numpy(tokens[:97].astype(np.int64))  # 3 windows of 32: the same tokens
        x, y = w[:96].view(-1, L), w[1:97].view(-1, L)
        with torch.no_grad():
            nll = F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten(), reduction="none")
        nll = nll.view(-1, L).mean(0)  # (L,) mean over windows
        r = got[f"x{f}"]
        assert r["windows"] == 96 // L
        assert r["test_loss"] == pytest.approx(nll.mean().item(), rel=1e-5)
        assert r["position_loss"] == pytest.approx(nll.view(-1, 4).mean(1).tolist(), rel=1e-5)
    # at factor 1 it is the windowed test loss over the same tokens
    assert got["x1"]["test_loss"] == pytest.approx(
        windowed_test_loss(model, tokens[:97], 16, 10, torch.device("cpu")), rel=1e-5)


def test_a_learned_table_gets_na_past_its_context_not_an_error():
    model = _tiny("learned")
    tokens = np.random.default_rng(0).integers(0, 7, size=100).astype(np.uint8)
    got = extrapolation(model, tokens, (1, 2, 4), 4, 2, 10_000, torch.device("cpu"))
    assert got["x2"] == got["x4"] == "n/a (learned table of 8 positions)"
    assert got["x1"]["test_loss"] > 0 and len(got["x1"]["position_loss"]) == 2


def test_extrapolation_needs_one_window_of_the_longest_length():
    with pytest.raises(ValueError, match="needs at least 33"):
        extrapolation(_tiny("rope"), np.zeros(32, np.uint8), (1, 4), 4, 2, 10_000,
                      torch.device("cpu"))
