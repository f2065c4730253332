"""The installed packages checked against ``requirements.lock`` before a stage computes: the
results record the lock's hash as their environment (:mod:`lmablate.tracking.environment`), so
the versions that compute must be the lock's."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

# The lock of the README's install, at the root of the checkout this package runs from (an
# editable install); absent from a wheel's install
LOCK = Path(__file__).resolve().parents[3] / "requirements.lock"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)\s*(?:;\s*(.+))?$")


def lock_mismatches(lock: Path = LOCK) -> list[str]:
    """The pins of ``lock`` (``name==version`` lines, pip-compile's) that the installed package
    does not match, as ``"name==pinned (installed: version)"``. A pin whose package is not
    installed (an extra not chosen: docs, cluster) or whose environment marker does not hold
    here is passed over; a local version label (``2.13.0+cpu``) matches its release. Empty
    without a lock."""
    from packaging.markers import Marker
    from packaging.version import InvalidVersion, Version

    try:
        text = lock.read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        m = _PIN.match(line.strip())
        if not m or (m[3] and not Marker(m[3]).evaluate()):
            continue
        try:
            installed = importlib.metadata.version(m[1])
        except importlib.metadata.PackageNotFoundError:
            continue
        try:
            same = Version(installed).public.split("+")[0] == Version(m[2]).public
        except InvalidVersion:
            same = installed == m[2]
        if not same:
            out.append(f"{m[1]}=={m[2]} (installed: {installed})")
    return out


def check_installed_lock(lock: Path = LOCK) -> None:
    """Refuse to compute where the installed packages are not those of ``lock``: the results
    would record the lock's hash (:func:`result_environment`) for versions that did not
    compute them.

    Raises:
        RuntimeError: naming the first mismatches and how to resolve them.
    """
    wrong = lock_mismatches(lock)
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise RuntimeError(
            f"{lock.name} pins {', '.join(wrong[:3])}{more}: the results would record versions "
            "that did not compute them; install the lock (pip install -c requirements.lock -e "
            ".) or restore it (git checkout requirements.lock)")
