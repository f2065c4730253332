"""Stage ``generate``: write a dataset's raw text (``lmablate generate <dataset>``).

Output files (UTF-8, ``\\n`` line ends, each written atomically):

* ``corpus.txt`` -- arithmetic: the train+validation pool, one problem per line
  (:mod:`lmablate.data.arithmetic`), each line ending in ``\\n``; text: the whole corpus
  (:mod:`lmablate.data.corpus`), exactly as loaded (after the optional ``max_chars`` cap).
* ``test.txt`` -- arithmetic only: the held-out problems, same format, disjoint from the pool.
  For a text dataset a stale ``test.txt`` is removed (``tokenize`` takes its presence to mean
  "this dataset brings its own test split").
* ``length.txt`` -- arithmetic only: the length-generalisation split, ``n_test`` problems for
  each of ``length_digits`` (both operands of exactly that many digits, in the format at that
  length: :func:`~lmablate.data.problem_sets.length_problems`), shortest first; empty without
  ``length_digits``. Longer than every training problem, so disjoint from the pool.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

from lmablate.config.study import DatasetConfig, StudyConfig
from lmablate.core import fileio
from lmablate.data.corpus import load_text_corpus
from lmablate.data.problem_sets import generate_arithmetic, length_problems


def _lines_text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def run(cfg: DatasetConfig, out_dir: Path) -> dict:
    """Write ``out_dir/corpus.txt`` (and ``test.txt`` for arithmetic); see the module doc.

    Creates ``out_dir``; every file is written atomically. Returns a summary: ``dataset``,
    ``kind``, ``corpus_chars``, ``corpus_lines``, ``test_chars``, ``test_lines`` (0 for text),
    ``seconds``; arithmetic adds ``n_train``, ``n_test``, ``n_length`` (problems) and
    ``line_length`` (characters of a training problem), text adds ``source``.

    Raises:
        TypeError: ``cfg`` is not a DatasetConfig.
        DataError / ChecksumError: see :func:`~lmablate.data.problem_sets.generate_arithmetic` and
            :func:`~lmablate.data.corpus.load_text_corpus`.
    """
    if not isinstance(cfg, DatasetConfig):
        raise TypeError(f"generate needs a DatasetConfig, got {type(cfg).__name__}")
    start = time.perf_counter()
    out_dir = Path(out_dir)
    summary: dict = {"dataset": cfg.name, "kind": cfg.kind}
    if cfg.kind == "arithmetic":
        fmt = cfg.format
        train, test = generate_arithmetic(cfg.n_train, cfg.n_test, cfg.seed, fmt, cfg.sampling)
        length = [p for n in cfg.length_digits
                  for p in length_problems(fmt, n, cfg.n_test, cfg.seed)]
        corpus, test_text = _lines_text(train), _lines_text(test)
        out_dir.mkdir(parents=True, exist_ok=True)
        fileio.write_text(out_dir / "test.txt", test_text)
        fileio.write_text(out_dir / "length.txt", _lines_text(length))
        summary.update(n_train=len(train), n_test=len(test), n_length=len(length),
                       line_length=fmt.line_length)
    else:
        corpus, test_text = load_text_corpus(cfg), ""
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("test.txt", "length.txt"):  # tokenize would take a test.txt for a split
            with contextlib.suppress(FileNotFoundError):
                (out_dir / stale).unlink()
        summary.update(source=cfg.source)
    fileio.write_text(out_dir / "corpus.txt", corpus)
    summary.update(corpus_chars=len(corpus), corpus_lines=_count_lines(corpus),
                   test_chars=len(test_text), test_lines=_count_lines(test_text),
                   seconds=round(time.perf_counter() - start, 3))
    return summary


def main(cfg: StudyConfig, args: argparse.Namespace) -> None:
    """``lmablate generate <dataset> --out DIR``."""
    run(cfg.dataset(args.dataset), args.out)
