"""Stage ``tokenize``: character vocabulary and token arrays (``lmablate tokenize <dataset>``).

Reads ``corpus.txt`` (and ``test.txt``) from the raw folder, splits it, builds the
:class:`~lmablate.data.tokenizer.CharTokenizer` from the training split and writes the files that
:mod:`lmablate.data.tokenizer` describes and reads back.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmablate.config.study import DatasetConfig, StudyConfig
from lmablate.core import fileio
from lmablate.data.corpus import read_text_file
from lmablate.data.tokenizer import SPLITS, UNK_ID, CharTokenizer, TokenizerError, split_text


def _strip_newlines(pieces: dict[str, str]) -> dict[str, str]:
    return {k: v.replace("\n", "") for k, v in pieces.items()}


def _read_splits(cfg: DatasetConfig, raw_dir: Path) -> tuple[dict[str, str], bool]:
    """The three split texts of a dataset (before newline stripping), and whether the test
    split came from ``raw_dir/test.txt``."""
    corpus_path, test_path = raw_dir / "corpus.txt", raw_dir / "test.txt"
    if not corpus_path.is_file():
        raise TokenizerError(f"{corpus_path} not found; run `lmablate generate {cfg.name}` first")
    has_test_file = test_path.is_file()
    if has_test_file and cfg.split.test:
        raise TokenizerError(f"dataset {cfg.name}: {test_path} provides the test split, so "
                             f"datasets.{cfg.name}.split.test must be 0 (got {cfg.split.test})")
    text = read_text_file(corpus_path)
    if has_test_file:
        train, val, _ = split_text(text, cfg.split.val, 0.0)
        return {"train": train, "val": val, "test": read_text_file(test_path)}, True
    train, val, test = split_text(text, cfg.split.val, cfg.split.test)
    return {"train": train, "val": val, "test": test}, False


def run(cfg: DatasetConfig, raw_dir: Path, out_dir: Path) -> dict:
    """Split ``raw_dir/corpus.txt``, build the vocabulary, write token files.

    Splits are contiguous (train | val | test, fractions ``cfg.split`` of the corpus's
    characters, split points moved forward to line starts). If ``raw_dir/test.txt`` exists
    (arithmetic) it is the test split and the corpus is split into train | val only. With
    ``cfg.strip_newlines`` every ``\\n`` is removed from each split *after* splitting (seed
    000). The tokenizer is built from the train split only; val/test characters it has not
    seen become the unknown id 0. Writes ``vocab.json``, ``{train,val,test}.bin`` and
    ``meta.json`` into ``out_dir`` (formats: :mod:`lmablate.data.tokenizer`) and returns the meta
    dict; an arithmetic dataset's meta adds ``line_length``, the tokens of one problem (its newline
    included unless stripped), at whose multiples training windows start
    (:attr:`lmablate.data.token_data.TokenData.stride`).

    Raises:
        TokenizerError: ``corpus.txt`` missing; ``test.txt`` present but ``split.test`` > 0;
            a split that ends up empty (message names the dataset and the fractions).
        DataError: a raw file that is not UTF-8.
    """
    if not isinstance(cfg, DatasetConfig):
        raise TypeError(f"tokenize needs a DatasetConfig, got {type(cfg).__name__}")
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    pieces, test_from_file = _read_splits(cfg, raw_dir)
    if cfg.strip_newlines:
        pieces = _strip_newlines(pieces)
    empty = [k for k in SPLITS if not pieces[k]]
    if empty:
        raise TokenizerError(
            f"dataset {cfg.name}: the {', '.join(empty)} split is empty (split.val="
            f"{cfg.split.val}, split.test={cfg.split.test}, corpus of "
            f"{sum(len(p) for p in pieces.values())} characters"
            f"{', test from test.txt' if test_from_file else ''}); use larger fractions or a "
            "corpus with more lines")
    tok = CharTokenizer.from_text(pieces["train"])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(out_dir / "vocab.json")
    for split in SPLITS:
        with fileio.atomic_writer(out_dir / f"{split}.bin") as f:
            f.write(tok.encode(pieces[split]).astype(tok.dtype).tobytes())
    meta = {
        "dataset": cfg.name, "vocab_size": tok.vocab_size, "dtype": tok.dtype.name,
        "unk_id": UNK_ID, "unk": tok.unk,
        "tokens": {k: len(pieces[k]) for k in SPLITS},
        "split": {"val": cfg.split.val, "test": cfg.split.test},
        "strip_newlines": cfg.strip_newlines, "test_from_file": test_from_file,
    }
    if cfg.kind == "arithmetic":  # every problem this long: training windows start at one
        meta["line_length"] = cfg.format.line_length + (not cfg.strip_newlines)
    fileio.write_json(out_dir / "meta.json", meta, indent=1)
    return meta


def main(cfg: StudyConfig, args: argparse.Namespace) -> None:
    """``lmablate tokenize <dataset> --raw DIR --out DIR``."""
    run(cfg.dataset(args.dataset), args.raw, args.out)
