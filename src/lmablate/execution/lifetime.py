"""Processes that end with their parent: Linux's parent-death signal (``prctl(2)``,
``PR_SET_PDEATHSIG``), for a stage run by ``dvc`` and for a stage's worker processes, so that
killing the parent never leaves a child writing outputs nobody will record."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

__all__ = ["die_with_parent", "parent_is_dvc"]

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent (pid ``parent``, the one
    it had when it started) dies, and if it already has, end now. Returns whether the signal
    is armed: Linux only; elsewhere only the check is made."""
    armed = sys.platform == "linux"
    if armed:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    return armed


def parent_is_dvc(ppid: int | None = None) -> bool:
    """Whether the parent process (``ppid``, default this one's) runs DVC: one of its first two
    arguments is a program named ``dvc`` (``dvc repro``, ``python .../bin/dvc repro``)."""
    ppid = os.getppid() if ppid is None else ppid
    try:
        argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(os.path.basename(arg) == b"dvc" for arg in argv[:2])
