"""The character tokenizer and its files: vocabulary, token arrays and their metadata.

As seed 004's ``IndexTokenizer``: one token per character of the *training* split, in sorted
(code point) order, ids ``1..len(chars)``, plus a reserved unknown symbol at id 0 for any
character outside the vocabulary. The ``tokenize`` stage (:mod:`lmablate.stages.tokenize`)
writes ``vocab.json``, ``{train,val,test}.bin`` and ``meta.json`` (last), each atomically;
:func:`load_split` and :func:`load_tokenizer` read them back. The files' format: the handbook's
Datasets and metrics, "Token files"."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from lmablate.core import fileio
from lmablate.core.validation import DataError

__all__ = [
    "TokenizerError", "CharTokenizer", "UNK", "UNK_ID", "SPLITS", "VOCAB_FORMAT",
    "split_text", "load_split", "load_tokenizer", "read_meta",
]

UNK = "\u00d8"  # "Ø", seed 004's unknown symbol; decode() writes it for unknown/invalid ids
UNK_ID = 0
SPLITS = ("train", "val", "test")
VOCAB_FORMAT = "lmablate-char-tokenizer"
_MAX_VOCAB = 1 << 16  # ids must fit uint16
_LOOKUP_LIMIT = 1 << 18  # code points below this encode through a lookup table


class TokenizerError(ValueError):
    """Bad tokenizer input, an empty split, or a missing/corrupted token file (message names
    the file or dataset, and what was expected)."""


def _check_char(ch: object, what: str) -> str:
    if not isinstance(ch, str) or len(ch) != 1:
        raise TokenizerError(f"{what} {ch!r} is not allowed; expected a single character")
    return ch


def _codepoints(text: str) -> np.ndarray:
    """The code points of ``text`` as a uint32 array (UTF-32 view, no Python loop)."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def _read_json(path: Path, what: str) -> object:
    """Parse the JSON file ``path``; TokenizerError naming ``what`` if missing or malformed."""
    if not path.is_file():
        raise TokenizerError(f"{what} not found; run `lmablate tokenize` first")
    try:
        return fileio.read_json(path)
    except ValueError as exc:  # not JSON or not UTF-8; the message names the file
        raise TokenizerError(str(exc)) from None


class CharTokenizer:
    """Character-level tokenizer with a reserved unknown symbol at id 0 (seed 004).

    ``CharTokenizer(chars)`` takes the vocabulary characters (any order, duplicates merged; the
    unknown symbol itself is never a vocabulary entry -- it encodes to id 0 and decodes back to
    itself, so it round-trips). Usually built with :meth:`from_text` on the training split.

    Raises:
        TokenizerError: an entry that is not a single character, or more than 65535 characters.
    """

    def __init__(self, chars: Iterable[str], unk: str = UNK) -> None:
        self.unk = _check_char(unk, "unknown symbol")
        chars = {_check_char(c, "vocabulary entry") for c in chars} - {unk}
        self.chars: tuple[str, ...] = tuple(sorted(chars))
        if self.vocab_size > _MAX_VOCAB:
            raise TokenizerError(f"vocabulary of {self.vocab_size} symbols does not fit uint16 "
                                 f"ids; at most {_MAX_VOCAB}")
        self._codes = _codepoints("".join(self.chars)).astype(np.int64)  # sorted
        self._decode_table = _codepoints(self.unk + "".join(self.chars)).copy()
        self._lookup = self._make_lookup(self._codes)

    @staticmethod
    def _make_lookup(codes: np.ndarray) -> np.ndarray | None:
        """Code point -> id table (last entry: any larger code point -> unknown), or None when
        the largest code point would make it bigger than 1 MiB (then encode() bisects)."""
        if not len(codes) or codes[-1] >= _LOOKUP_LIMIT:
            return None
        table = np.full(int(codes[-1]) + 2, UNK_ID, dtype=np.uint32)
        table[codes] = np.arange(1, len(codes) + 1, dtype=np.uint32)
        return table

    @classmethod
    def from_text(cls, text: str, unk: str = UNK) -> "CharTokenizer":
        """The tokenizer whose vocabulary is the distinct characters of ``text``."""
        return cls(np.unique(_codepoints(text)).tobytes().decode("utf-32-le"), unk)

    @property
    def vocab_size(self) -> int:
        """Number of ids: the characters plus the unknown symbol."""
        return len(self.chars) + 1

    @property
    def unk_id(self) -> int:
        """Id of the unknown symbol (always 0)."""
        return UNK_ID

    @property
    def dtype(self) -> np.dtype:
        """Smallest storage dtype for the ids: uint8 up to 256 symbols, else uint16."""
        return np.dtype(np.uint8 if self.vocab_size <= 256 else np.uint16)

    def token_id(self, ch: str) -> int:
        """Id of one character; :data:`UNK_ID` for a character outside the vocabulary."""
        return int(self.encode(_check_char(ch, "character"))[0])

    def encode(self, text: str) -> np.ndarray:
        """Ids of the characters of ``text`` (int64 array, one id per character); characters
        outside the vocabulary get :data:`UNK_ID`. Vectorised: ~0.1 s per million characters."""
        cps = _codepoints(text)
        if not len(self._codes):
            return np.zeros(len(cps), dtype=np.int64)
        if self._lookup is not None:  # small code points: one table gather
            return self._lookup[np.minimum(cps, len(self._lookup) - 1)].astype(np.int64)
        pos = np.searchsorted(self._codes, cps)
        pos_clipped = np.minimum(pos, len(self._codes) - 1)
        known = self._codes[pos_clipped] == cps
        return np.where(known, pos_clipped + 1, UNK_ID).astype(np.int64)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of ``ids`` (any integer array-like, e.g. a list or a CPU tensor).

        Id 0 and any id outside ``0..vocab_size-1`` (negative or too large) decode to the
        unknown symbol ``self.unk`` (``"Ø"`` by default), as in seed 004.
        """
        arr = np.asarray(ids)
        if arr.size == 0:
            return ""
        if arr.dtype.kind not in "iub":
            raise TokenizerError(f"decode() needs integer ids, got dtype {arr.dtype}")
        arr = arr.reshape(-1).astype(np.int64)
        arr = np.where((arr < 0) | (arr >= self.vocab_size), UNK_ID, arr)
        return self._decode_table[arr].tobytes().decode("utf-32-le")

    def to_dict(self) -> dict:
        """The JSON-able form written by :meth:`save` (see the module docstring)."""
        return {"format": VOCAB_FORMAT, "version": 1, "unk": self.unk, "unk_id": UNK_ID,
                "chars": list(self.chars)}

    def save(self, path: Path) -> None:
        """Write :meth:`to_dict` as JSON to ``path``, atomically."""
        fileio.write_json(Path(path), self.to_dict(), indent=1)

    @classmethod
    def load(cls, path: Path) -> "CharTokenizer":
        """Read a tokenizer written by :meth:`save`.

        Raises:
            TokenizerError: missing file, not JSON, wrong format tag/version, or a ``chars``
                list that is not sorted unique single characters (message names the file).
        """
        path = Path(path)
        data = _read_json(path, f"vocabulary file {path}")
        ok = (isinstance(data, dict) and data.get("format") == VOCAB_FORMAT
              and data.get("version") == 1 and data.get("unk_id") == UNK_ID
              and isinstance(data.get("chars"), list))
        if not ok:
            raise TokenizerError(f"{path}: expected {{\"format\": \"{VOCAB_FORMAT}\", "
                                 "\"version\": 1, \"unk\": ..., \"unk_id\": 0, \"chars\": [...]}")
        chars = data["chars"]
        try:
            tok = cls(chars, data.get("unk"))
        except TokenizerError as exc:
            raise TokenizerError(f"{path}: {exc}") from None
        if list(tok.chars) != chars:
            raise TokenizerError(f"{path}: \"chars\" must be sorted, unique single characters "
                                 "without the unknown symbol")
        return tok

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CharTokenizer) and self.chars == other.chars
                and self.unk == other.unk)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, unk={self.unk!r})"


# --------------------------------------------------------------------------------------------
# splitting
# --------------------------------------------------------------------------------------------

def _next_line_start(text: str, pos: int) -> int:
    """``pos`` if a line starts there (or it is an end of ``text``), else the start of the
    next line (``len(text)`` when there is none)."""
    if pos <= 0 or pos >= len(text) or text[pos - 1] == "\n":
        return max(0, min(pos, len(text)))
    nl = text.find("\n", pos)
    return len(text) if nl < 0 else nl + 1


def split_text(text: str, val: float, test: float) -> tuple[str, str, str]:
    """Contiguous, disjoint ``(train, val, test)`` pieces of ``text``: train | val | test.

    The last ``test`` fraction of the characters is the test piece, the ``val`` fraction
    before it the validation piece; each split point then moves forward to the next line
    start, so no line is cut. ``train + val + test == text`` always. Pieces may be empty
    (the caller decides whether that is an error).
    """
    n = len(text)
    val_start = _next_line_start(text, int(n * (1.0 - val - test)))
    test_start = _next_line_start(text, int(n * (1.0 - test)))
    test_start = max(test_start, val_start)
    return text[:val_start], text[val_start:test_start], text[test_start:]


# --------------------------------------------------------------------------------------------
# reading back
# --------------------------------------------------------------------------------------------

def read_meta(tokens_dir: Path) -> dict:
    """``tokens_dir/meta.json`` as a dict.

    Raises:
        TokenizerError: missing, not JSON, or lacking ``vocab_size``/``dtype``/``tokens``.
    """
    path = Path(tokens_dir) / "meta.json"
    meta = _read_json(path, str(path))
    ok = (isinstance(meta, dict) and meta.get("dtype") in ("uint8", "uint16")
          and isinstance(meta.get("vocab_size"), int) and isinstance(meta.get("tokens"), dict))
    if not ok:
        raise TokenizerError(f"{path}: expected vocab_size, dtype (uint8 or uint16) and tokens")
    return meta


def load_split(tokens_dir: Path, split: str) -> np.memmap:
    """Read-only memory map of ``tokens_dir/<split>.bin`` (dtype and length from meta.json).

    Raises:
        TokenizerError: ``split`` not one of train/val/test; meta.json missing or bad; the
            ``.bin`` file missing, or its size differs from meta's token count times the
            dtype's size (truncated or corrupted; message names file, expected, actual bytes).
    """
    if split not in SPLITS:
        raise TokenizerError(f"split {split!r} is not allowed; choose one of {', '.join(SPLITS)}")
    tokens_dir = Path(tokens_dir)
    meta = read_meta(tokens_dir)
    dtype = np.dtype(meta["dtype"])
    n = meta["tokens"].get(split)
    path = tokens_dir / f"{split}.bin"
    if not isinstance(n, int) or n <= 0:
        raise TokenizerError(f"{tokens_dir / 'meta.json'}: tokens.{split}={n!r}; expected > 0")
    if not path.is_file():
        raise TokenizerError(f"{path} not found; run `lmablate tokenize` again")
    expected, actual = n * dtype.itemsize, path.stat().st_size
    if actual != expected:
        raise TokenizerError(f"{path} has {actual} bytes, expected {expected} ({n} tokens of "
                             f"{dtype.name}); the file is truncated or corrupted, re-run "
                             "`lmablate tokenize`")
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


def load_tokenizer(tokens_dir: Path) -> CharTokenizer:
    """The tokenizer saved in ``tokens_dir/vocab.json``, checked against meta.json's
    ``vocab_size`` when meta.json exists.

    Raises:
        TokenizerError: see :meth:`CharTokenizer.load`; or a vocab_size mismatch.
    """
    tokens_dir = Path(tokens_dir)
    tok = CharTokenizer.load(tokens_dir / "vocab.json")
    if (tokens_dir / "meta.json").is_file():
        meta = read_meta(tokens_dir)
        if meta["vocab_size"] != tok.vocab_size:
            raise TokenizerError(f"{tokens_dir}: vocab.json has {tok.vocab_size} symbols but "
                                 f"meta.json says vocab_size={meta['vocab_size']}")
    return tok


def split_lines(tokens_dir: Path, split: str) -> list[str]:
    """The lines of one split of a dataset tokenized with ``line_length`` in meta.json (an
    arithmetic dataset: one problem per line): the split decoded and cut every
    ``line_length`` characters, or at its newlines where they were kept. Empty without
    ``line_length`` (a text corpus, or tokens written before it was recorded).

    Raises:
        TokenizerError: the tokenizer or split is missing or bad.
        DataError: the split is not a whole number of ``line_length`` lines.
    """
    length = read_meta(tokens_dir).get("line_length")
    if not length:
        return []
    text = load_tokenizer(tokens_dir).decode(np.asarray(load_split(tokens_dir, split)))
    if "\n" in text:
        return [line for line in text.split("\n") if line]
    if len(text) % int(length):
        raise DataError(f"{tokens_dir}: the {split} split's {len(text)} characters are not "
                        f"a whole number of problems of line_length={length}")
    return [text[i:i + int(length)] for i in range(0, len(text), int(length))]
