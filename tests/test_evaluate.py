"""Evaluation: batched, cached, threaded greedy decoding equals one problem at a time without a
cache; exact match and character accuracy follow seed 000's definitions; test loss is the mean
cross-entropy over non-overlapping windows."""

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmablate.config.study import DataError, ModelConfig
from lmablate.data.arithmetic import ArithmeticFormat, format_problem, split_problem
from lmablate.data.tokenizer import CharTokenizer
from lmablate.evaluate.metrics import (answer_nats, arithmetic_predictions, arithmetic_scores,
                                 by_operand_digits, extrapolation, not_reaching, split_loss)
from lmablate.model.gpt import GPT

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
    assert s["per_op"]["add"] == {"char_accuracy": 1.0, "exact_match": 1.0, "n": 1}
    assert s["per_op"]["mul"]["char_accuracy"] == pytest.approx(10 / 11)
    assert s["per_op"]["mul"]["exact_match"] == 0.0
    assert s["per_op"]["div"]["char_accuracy"] == pytest.approx(1 / 11)


TWO_DIGITS = ArithmeticFormat(2)  # $(007+091)=890$
MIXED = [format_problem(7, "+", 91, TWO_DIGITS), format_problem(13, "-", 50, TWO_DIGITS),
         format_problem(345, "+", 678, TWO_DIGITS.at_digits(3)),
         format_problem(5, "-", 9, TWO_DIGITS), format_problem(901, "-", 999,
                                                                TWO_DIGITS.at_digits(3))]


def scaled_model(position: str, context_length: int = 40) -> GPT:
    tok = CharTokenizer(ALPHABET)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4,
                            context_length=context_length, position=position)).eval()
    with torch.no_grad():  # larger weights: outputs that depend on the input
        for p in model.parameters():
            p.mul_(25)
    return model


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_problems_of_several_lengths_decode_as_one_at_a_time_in_their_order(position):
    tok, model = CharTokenizer(ALPHABET), scaled_model(position)
    assert {len(p) for p in MIXED} == {15, 18}  # two formats, interleaved
    reference = one_at_a_time(model, tok, MIXED)
    for batch_size, workers in [(1, 1), (2, 1), (5, 1), (2, 3)]:
        got = arithmetic_predictions(model, tok, MIXED, batch_size, torch.device("cpu"),
                                     workers=workers)
        assert got == reference, (batch_size, workers)
    assert [len(p) for p in reference] == [len(split_problem(p)[1]) for p in MIXED]


def test_a_scheme_without_a_table_decodes_past_its_context_as_one_at_a_time():
    tok, model = CharTokenizer(ALPHABET), scaled_model("rope", context_length=12)
    long = [p for p in MIXED if len(p) == 18]  # 18 characters, context 12
    assert not_reaching(model, 18) is None
    assert arithmetic_predictions(model, tok, long, 2, torch.device("cpu")) == one_at_a_time(
        model, tok, long)


def test_a_learned_table_cannot_read_past_its_positions():
    tok, model = CharTokenizer(ALPHABET), scaled_model("learned", context_length=16)
    assert not_reaching(model, 17) is None  # 16 inputs predict the 17th character
    assert not_reaching(model, 18) == "n/a (learned table of 16 positions)"
    with pytest.raises(ValueError, match="18 characters cannot be read: n/a"):
        arithmetic_predictions(model, tok, MIXED, 2, torch.device("cpu"))
    with pytest.raises(ValueError, match="18 characters cannot be read: n/a"):
        answer_nats(model, tok, MIXED, 2, torch.device("cpu"))


class NextIsCurrent(torch.nn.Module):
    """A stand-in model whose every prediction gives logit ``a`` to "the next character is
    this one" and 0 to every other character: its loss is computable by hand."""

    def __init__(self, vocab_size: int, a: float):
        super().__init__()
        self.cfg = ModelConfig(vocab_size=vocab_size, d_model=16, n_layers=1, n_heads=2,
                               context_length=64)
        self.position = type("P", (), {"max_positions": None})()
        self.a = a

    def forward(self, idx, targets=None):
        return torch.nn.functional.one_hot(idx, self.cfg.vocab_size).float() * self.a, None


def test_answer_loss_on_a_constructed_example_equals_the_hand_computation():
    tok = CharTokenizer(ALPHABET)
    V, a = tok.vocab_size, 2.0
    line = "$(011+011)=220$"  # 11 + 11 = 22, reversed "220", then "$"
    assert format_problem(11, "+", 11, TWO_DIGITS) == line
    # answer "220$" after the prompt's last character "=": pairs (=,2) (2,2) (2,0) (0,$);
    # only "2" after "2" repeats its predecessor
    same, other = -math.log(math.exp(a) / (math.exp(a) + V - 1)), math.log(math.exp(a) + V - 1)
    expected = same + 3 * other
    nats = answer_nats(NextIsCurrent(V, a), tok, [line, line], 1, torch.device("cpu"))
    assert nats == pytest.approx([expected, expected], rel=1e-6)
    s = arithmetic_scores([line], ["220$"], nats[:1])
    assert s["answer_loss"] == pytest.approx(expected / 4, rel=1e-6)  # nats per answer char


def test_answer_loss_of_a_model_equals_one_prefix_at_a_time():
    tok, model = CharTokenizer(ALPHABET), scaled_model("alibi")
    slow = []
    for line in MIXED:
        prompt, target = split_problem(line)
        ids = torch.tensor(tok.encode(line), dtype=torch.long)
        total = 0.0
        for j in range(len(prompt), len(line)):  # each answer character from its prefix alone
            with torch.no_grad():
                logits = model(ids[None, :j])[0][0, -1]
            total -= torch.log_softmax(logits, -1)[ids[j]].item()
        slow.append(total)
    for batch_size in (1, 2, 5):
        fast = answer_nats(model, tok, MIXED, batch_size, torch.device("cpu"))
        assert fast == pytest.approx(slow, rel=1e-4)


def test_scores_break_down_by_operation_answer_length_and_operand_length():
    problems = MIXED
    targets = [split_problem(p)[1] for p in problems]
    preds = list(targets)
    preds[1] = "$" * len(targets[1])  # 13 - 50 = -37 ("73-$"): all wrong but the "$"
    nats = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    s = arithmetic_scores(problems, preds, nats)
    lengths = [len(t) for t in targets]  # 4, 4, 5, 4, 5 answer characters
    assert lengths == [4, 4, 5, 4, 5]
    assert s["answer_loss"] == pytest.approx(15 / 22)
    assert s["exact_match"] == pytest.approx(4 / 5)
    assert s["per_op"]["sub"] == {"char_accuracy": pytest.approx((4 + 1 + 5) / 13),
                                  "exact_match": pytest.approx(2 / 3),
                                  "answer_loss": pytest.approx((2 + 4 + 5) / 13), "n": 3}
    # answers 98, -37, 1023, -4, -98: digits 2, 2, 4, 1, 2
    assert {d: v["n"] for d, v in s["by_answer_digits"].items()} == {"1": 1, "2": 3, "4": 1}
    assert s["by_answer_digits"]["2"]["answer_loss"] == pytest.approx((1 + 2 + 5) / 13)
    d = by_operand_digits(problems, preds, nats, "test")
    assert list(d) == ["1", "2", "3"]  # 5-9; 7+91 and 13-50; the 3-digit ones
    assert d["2"] == {"char_accuracy": pytest.approx(5 / 8), "exact_match": 0.5,
                      "answer_loss": pytest.approx(3 / 8), "n": 2, "split": "test"}
    assert d["3"]["n"] == 2 and d["3"]["exact_match"] == 1.0


def test_split_loss_is_mean_cross_entropy_over_windows():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=7, d_model=16, n_layers=1, n_heads=2,
                            context_length=8)).eval()
    tokens = np.random.default_rng(0).integers(0, 7, size=8 * 5 + 3).astype(np.uint8)
    got = split_loss(model, tokens, batch_size=2, max_batches=10, device=torch.device("cpu"))
    windows = torch.from_numpy(tokens[:41].astype(np.int64))
    x, y = windows[:40].view(5, 8), windows[1:41].view(5, 8)
    with torch.no_grad():
        expected = F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten()).item()
    assert got == pytest.approx(expected, rel=1e-5)
    assert got > math.log(7) * 0.5
    with pytest.raises(ValueError, match="need at least 9"):
        split_loss(model, tokens[:8], 2, 10, torch.device("cpu"))


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
        split_loss(model, tokens[:97], 16, 10, torch.device("cpu")), rel=1e-5)


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


class _Adder(torch.nn.Module):
    """A model that computes each answer (the length test's measurement control): from the
    characters so far of a line it predicts the next character of the correct answer; with
    ``up_to`` digits it answers a longer problem with the right length but a wrong first
    digit. Same interface as GPT for decoding: ``cfg``, ``position``, ``forward``,
    ``generate`` (full forwards, no cache)."""

    def __init__(self, tok: CharTokenizer, fmt: ArithmeticFormat, up_to: int | None = None):
        super().__init__()
        self.tok, self.fmt, self.up_to = tok, fmt, up_to
        self.cfg = ModelConfig(vocab_size=tok.vocab_size, context_length=64)
        self.position = type("NoTable", (), {"max_positions": None})()

    def _next(self, text: str) -> str:
        start = text.rfind("$(")
        line = text[start:]
        if ")=" not in line:
            return "0"  # a question character: any guess, it is not scored
        a, op, b = re.fullmatch(r"(\d+)([+-])(\d+)", line[2:line.index(")=")]).groups()
        c = int(a) + int(b) if op == "+" else int(a) - int(b)
        answer = str(c).rjust(self.fmt.width, "0")[::-1] + "$"  # the format's rule
        if self.up_to is not None and max(len(a.lstrip("0")), len(b.lstrip("0"))) > self.up_to:
            answer = str((int(answer[0]) + 1) % 10) + answer[1:]
        return answer[len(line) - line.index(")=") - 2]

    def forward(self, idx: torch.Tensor, cache=None):
        logits = torch.full((*idx.shape, self.tok.vocab_size), -30.0)
        for r, row in enumerate(idx.tolist()):
            text = self.tok.decode(np.array(row))
            for j in range(len(row)):
                logits[r, j, self.tok.token_id(self._next(text[:j + 1]))] = 30.0
        return logits, None

    def generate(self, idx: torch.Tensor, max_new_tokens: int, greedy: bool = True):
        for _ in range(max_new_tokens):
            nxt = self(idx)[0][:, -1].argmax(-1, keepdim=True)
            idx = torch.cat((idx, nxt), 1)
        return idx


@pytest.mark.parametrize("up_to, expected", [(None, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}),
                                             (2, {1: 1.0, 2: 1.0, 3: 0.0, 4: 0.0})])
def test_the_length_test_reads_what_a_model_that_adds_computes(up_to, expected):
    """The positive control of the measurement: the default format's test and length splits,
    through the functions the evaluate stage calls, read exact match 1 at every operand length
    for a model that adds, and 0 past two digits for one that adds only up to two."""
    from lmablate.data.problem_sets import generate_arithmetic, length_problems
    fmt = ArithmeticFormat(digits=2, operations=("+", "-")).padded_for((3, 4))
    tok = CharTokenizer(ALPHABET)
    _, test = generate_arithmetic(50, 60, seed=1, fmt=fmt)
    model = _Adder(tok, fmt, up_to)
    cpu = torch.device("cpu")
    found = by_operand_digits(test, arithmetic_predictions(model, tok, test, 16, cpu),
                              answer_nats(model, tok, test, 16, cpu), "test")
    for n in (3, 4):
        lines = length_problems(fmt, n, 20, seed=1)
        assert len(lines[0]) == len(test[0])  # only the operands' length differs
        found.update(by_operand_digits(lines, arithmetic_predictions(model, tok, lines, 16, cpu),
                                       answer_nats(model, tok, lines, 16, cpu), "length"))
    assert {int(n): r["exact_match"] for n, r in found.items()} == expected
    for n, r in found.items():
        right = expected[int(n)] == 1.0
        assert (r["answer_loss"] < 1e-6) == right, (n, r)
        assert r["split"] == ("length" if int(n) > 2 else "test")
