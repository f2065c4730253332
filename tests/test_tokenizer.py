"""Stage ``tokenize`` and lmablate.data.tokenizer: vocabulary, unknown symbol, splits, token
files."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from lmablate.config.study import DatasetConfig, SplitConfig
from lmablate.data.token_data import TokenData, batch_starts, get_batch
from lmablate.data.tokenizer import (UNK, UNK_ID, CharTokenizer, TokenizerError, load_split,
                                load_tokenizer, split_text)
from lmablate.stages.generate import run as generate
from lmablate.stages.tokenize import run as tokenize

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


def text_cfg(**kw) -> DatasetConfig:
    kw.setdefault("split", SplitConfig(val=0.2, test=0.2))
    return DatasetConfig(name="tiny", kind="text", source="unused.txt", **kw)


def write_raw(tmp_path, corpus: str, test: str | None = None):
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    (raw / "corpus.txt").write_text(corpus, encoding="utf-8", newline="")
    if test is not None:
        (raw / "test.txt").write_text(test, encoding="utf-8", newline="")
    return raw


# ---------------------------------------------------------------------------------------------
# CharTokenizer
# ---------------------------------------------------------------------------------------------

def test_vocabulary_is_sorted_with_unknown_at_zero():
    tok = CharTokenizer.from_text("hello world")
    assert tok.chars == (" ", "d", "e", "h", "l", "o", "r", "w")
    assert tok.vocab_size == 9 and tok.unk_id == UNK_ID == 0
    assert tok.token_id(" ") == 1 and tok.token_id("w") == 8
    assert tok.decode([0]) == UNK == "Ø"


def test_round_trip_for_in_vocabulary_text():
    tok = CharTokenizer.from_text(TEXT + "ünïcødé ✓ \U0001F600")
    for s in (TEXT, "speak, hear", "ünïcødé ✓ \U0001F600", ""):
        ids = tok.encode(s)
        assert ids.dtype == np.int64 and len(ids) == len(s)
        assert tok.decode(ids) == s
        assert (ids > 0).all()


def test_unseen_characters_become_the_unknown_symbol():
    tok = CharTokenizer.from_text("abc")
    ids = tok.encode("abxc€\U0001F600")
    assert ids.tolist() == [1, 2, 0, 3, 0, 0]
    assert tok.decode(ids) == "abØcØØ"
    assert tok.token_id("z") == UNK_ID


def test_out_of_range_ids_decode_to_unknown():
    tok = CharTokenizer.from_text("ab")
    assert tok.decode(np.array([1, 2, 3, -1, 999])) == "abØØØ"
    with pytest.raises(TokenizerError):
        tok.decode(np.array([1.0, 2.0]))


def test_unknown_symbol_in_text_is_reserved_and_round_trips():
    tok = CharTokenizer.from_text("aØb")
    assert "Ø" not in tok.chars and tok.vocab_size == 3
    assert tok.encode("Ø").tolist() == [0]
    assert tok.decode(tok.encode("aØb")) == "aØb"


def test_large_code_points_use_the_bisect_path():
    tok = CharTokenizer(["a", "\U0010FFFF", "\u4e2d"])
    assert tok.encode("a中\U0010FFFFb").tolist() == [1, 2, 3, 0]


def test_bad_vocabulary_entries_are_rejected():
    with pytest.raises(TokenizerError, match="single character"):
        CharTokenizer(["ab"])
    with pytest.raises(TokenizerError, match="single character"):
        CharTokenizer.from_text("a").token_id("xy")


def test_save_load_round_trip(tmp_path):
    tok = CharTokenizer.from_text(TEXT + "\t\"\\é")
    tok.save(tmp_path / "vocab.json")
    data = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    assert data["unk"] == UNK and data["unk_id"] == 0 and data["chars"] == list(tok.chars)
    back = CharTokenizer.load(tmp_path / "vocab.json")
    assert back == tok and back.encode(TEXT).tolist() == tok.encode(TEXT).tolist()


@pytest.mark.parametrize("content", [
    "not json", json.dumps({"chars": ["a"]}),
    json.dumps({"format": "lmablate-char-tokenizer", "version": 1, "unk": "Ø", "unk_id": 0,
                "chars": ["b", "a"]}),
    json.dumps({"format": "lmablate-char-tokenizer", "version": 1, "unk": "Ø", "unk_id": 0,
                "chars": ["ab"]}),
])
def test_load_rejects_bad_vocab_files(tmp_path, content):
    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TokenizerError, match="vocab.json"):
        CharTokenizer.load(path)


def test_dtype_choice():
    assert CharTokenizer(chr(0x100 + i) for i in range(255)).dtype == np.uint8  # 256 ids
    assert CharTokenizer(chr(0x100 + i) for i in range(256)).dtype == np.uint16  # 257 ids


def test_encode_five_million_characters_quickly():
    text = (TEXT * (5_000_000 // len(TEXT) + 1))[:5_000_000]
    tok = CharTokenizer.from_text(text)
    start = time.perf_counter()
    ids = tok.encode(text)
    assert time.perf_counter() - start < 2.0 and len(ids) == 5_000_000


# ---------------------------------------------------------------------------------------------
# splitting and the stage
# ---------------------------------------------------------------------------------------------

def test_split_text_is_contiguous_and_cuts_no_line():
    lines = [f"line {i} " + "x" * (i % 7) + "\n" for i in range(200)]
    text = "".join(lines)
    for val, test in [(0.1, 0.1), (0.05, 0.2), (0.33, 0.0), (0.5, 0.4)]:
        train, v, t = split_text(text, val, test)
        assert train + v + t == text
        for piece in (train, v):
            assert piece == "" or piece.endswith("\n")
        for piece in (train, v, t):
            assert set(piece.splitlines(keepends=True)) <= set(lines)


def test_tokenize_text_dataset(tmp_path):
    corpus = "".join(f"{i} to be or not to be\n" for i in range(100)) + "Zoot!"
    raw = write_raw(tmp_path, corpus)
    meta = tokenize(text_cfg(), raw, tmp_path / "tok")
    assert meta["vocab_size"] == len(set(load_tokenizer(tmp_path / "tok").chars)) + 1
    assert meta["dtype"] == "uint8" and meta["unk_id"] == 0
    assert json.loads((tmp_path / "tok" / "meta.json").read_text()) == meta
    tok = load_tokenizer(tmp_path / "tok")
    pieces = {s: tok.decode(load_split(tmp_path / "tok", s)) for s in ("train", "val", "test")}
    # the final line holds characters unseen in train: they read back as the unknown symbol
    assert pieces["test"].endswith("\nØootØ")
    joined = pieces["train"] + pieces["val"] + pieces["test"]
    assert joined == corpus.replace("Z", "Ø").replace("!", "Ø")
    assert sum(meta["tokens"].values()) == len(corpus)
    assert abs(meta["tokens"]["test"] - 0.2 * len(corpus)) < 30  # within one line
    for s in ("train", "val"):
        assert pieces[s].endswith("\n")  # no cut lines
    assert not [p for p in (tmp_path / "tok").iterdir() if p.name.endswith(".tmp")]


def test_tokenize_arithmetic_dataset_strips_newlines_after_splitting(tmp_path):
    cfg = DatasetConfig(name="arith", kind="arithmetic", n_train=300, n_test=40, seed=2,
                        strip_newlines=True, split=SplitConfig(val=0.1))
    raw = tmp_path / "raw"
    generate(cfg, raw)
    meta = tokenize(cfg, raw, tmp_path / "tok")
    corpus = (raw / "corpus.txt").read_text(encoding="utf-8")
    test = (raw / "test.txt").read_text(encoding="utf-8")
    tok = load_tokenizer(tmp_path / "tok")
    train, val, test_back = (tok.decode(load_split(tmp_path / "tok", s))
                             for s in ("train", "val", "test"))
    assert "\n" not in tok.chars and "Ø" not in train + val + test_back
    assert train + val == corpus.replace("\n", "") and test_back == test.replace("\n", "")
    L = meta["line_length"]  # every problem this long: training windows start at its multiples
    assert L == cfg.format.line_length == 15  # $(007+091)=890$: no length split, no padding
    assert len(val) % L == 0 and len(train) % L == 0  # whole problems only
    assert all(train[i:i + 2] == "$(" for i in range(0, len(train), L))
    assert val.startswith("$(") and val.endswith("$")
    assert meta["tokens"] == {"train": len(train), "val": len(val), "test": 40 * L}
    assert meta["test_from_file"] is True and meta["vocab_size"] <= 20
    assert TokenData.load(tmp_path / "tok").stride == L


def test_arithmetic_windows_start_at_problem_starts_and_text_windows_anywhere(tmp_path):
    cfg = DatasetConfig(name="arith", kind="arithmetic", n_train=300, n_test=40, seed=2,
                        strip_newlines=False, split=SplitConfig(val=0.1))
    generate(cfg, tmp_path / "raw")
    tokenize(cfg, tmp_path / "raw", tmp_path / "tok")
    data = TokenData.load(tmp_path / "tok")
    assert data.stride == cfg.format.line_length + 1  # the newline is kept
    tok = load_tokenizer(tmp_path / "tok")
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        x, y = get_batch(data.train, 8, 32, g, torch.device("cpu"), data.stride)
        assert all(tok.decode(row[:2].numpy()) == "$(" for row in x)
    # stride 1 draws exactly what the unaligned sampler drew: randint(n - T)
    starts = batch_starts(1000, 16, 64, torch.Generator().manual_seed(3))
    assert torch.equal(starts, torch.randint(1000 - 64, (16,),
                                             generator=torch.Generator().manual_seed(3)))
    # the last aligned start still leaves a whole window
    big = batch_starts(1000, 4096, 64, torch.Generator().manual_seed(3), stride=16)
    assert int(big.max()) + 64 + 1 <= 1000 and bool((big % 16 == 0).all())
    assert int(big.max()) == (1000 - 65) // 16 * 16


def test_test_file_with_test_fraction_is_an_error(tmp_path):
    raw = write_raw(tmp_path, TEXT, test="x\n")
    with pytest.raises(TokenizerError, match=r"tiny.*split\.test must be 0"):
        tokenize(text_cfg(), raw, tmp_path / "tok")


def test_empty_split_names_dataset_and_fractions(tmp_path):
    raw = write_raw(tmp_path, "one single line without any newline at all")
    with pytest.raises(TokenizerError, match=r"tiny.*val, test split is empty.*split\.val=0\.2"):
        tokenize(text_cfg(), raw, tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


def test_missing_corpus_is_an_error(tmp_path):
    with pytest.raises(TokenizerError, match="corpus.txt not found"):
        tokenize(text_cfg(), tmp_path / "nowhere", tmp_path / "tok")


def test_large_vocabulary_uses_uint16(tmp_path):
    chars = "".join(chr(0x4E00 + i) for i in range(300))
    corpus = "".join(chars[i:i + 30] + "\n" for i in range(0, 300, 30)) * 3
    raw = write_raw(tmp_path, corpus)
    meta = tokenize(text_cfg(), raw, tmp_path / "tok")
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 302  # 300 + "\n" + unknown
    train = load_split(tmp_path / "tok", "train")
    assert train.dtype == np.uint16
    assert (tmp_path / "tok" / "train.bin").stat().st_size == 2 * len(train)


def test_truncated_bin_is_detected(tmp_path):
    raw = write_raw(tmp_path, TEXT * 20)
    meta = tokenize(text_cfg(), raw, tmp_path / "tok")
    path = tmp_path / "tok" / "val.bin"
    path.write_bytes(path.read_bytes()[:-3])
    n = meta["tokens"]["val"]
    with pytest.raises(TokenizerError, match=rf"val\.bin has {n - 3} bytes, expected {n}"):
        load_split(tmp_path / "tok", "val")
    assert len(load_split(tmp_path / "tok", "train")) == meta["tokens"]["train"]


def test_load_split_rejects_unknown_split_and_missing_meta(tmp_path):
    with pytest.raises(TokenizerError, match="choose one of train, val, test"):
        load_split(tmp_path, "dev")
    with pytest.raises(TokenizerError, match="meta.json not found"):
        load_split(tmp_path, "train")


def test_load_split_is_a_read_only_memmap(tmp_path):
    raw = write_raw(tmp_path, TEXT * 20)
    tokenize(text_cfg(), raw, tmp_path / "tok")
    arr = load_split(tmp_path / "tok", "train")
    assert isinstance(arr, np.memmap) and not arr.flags.writeable


def test_load_tokenizer_checks_meta(tmp_path):
    raw = write_raw(tmp_path, TEXT * 20)
    tokenize(text_cfg(), raw, tmp_path / "tok")
    meta_path = tmp_path / "tok" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["vocab_size"] += 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(TokenizerError, match="vocab_size"):
        load_tokenizer(tmp_path / "tok")


def test_tokenize_rejects_raw_dicts(tmp_path):
    with pytest.raises(TypeError):
        tokenize({"name": "x"}, tmp_path, tmp_path)
