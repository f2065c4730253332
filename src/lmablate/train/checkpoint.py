"""Checkpoints of finished runs and resume states of interrupted ones.

Two files per seed, both written atomically with ``torch.save``:

* ``checkpoint.pt`` (:func:`save_checkpoint`): the model config as a dict, the weights, the
  optimizer state, the step and free-form ``meta``. :func:`load_checkpoint` rebuilds the GPT from
  it alone, so evaluation and the report need nothing but the file.
* ``resume.pt`` (:func:`save_resume`): the whole training state at an eval step (weights,
  optimizer, scheduler, random number generators, history), tagged with the run's fingerprint.
  :func:`load_resume` returns it only for the same fingerprint, so a state written for other
  settings, data or code is never resumed.

A checkpoint is trusted only through the sha256 of its bytes that ``train`` records in the
seed's ``result.json`` when it writes it (:func:`verify_checkpoint`): a file truncated, edited or
replaced since is trained again by ``train`` and refused by ``evaluate``, naming the file.
"""

from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path
from typing import Any

import torch

from lmablate.config.study import ModelConfig
from lmablate.core import fileio
from lmablate.core.validation import DataError
from lmablate.model.gpt import GPT

def _interned(obj: Any) -> Any:
    """``obj`` with every string interned, in dicts (keys too, ``_metadata`` kept), lists and
    tuples. Pickle writes a string it has seen as the same object once and refers back to it
    later, so equal states whose strings are different objects would give other bytes: a run
    resumed from ``resume.pt`` holds the optimizer's state keys (``"step"``, ``"exp_avg"``) as
    strings read back from the file, an uninterrupted run holds torch's own constants."""
    if type(obj) is str:
        return sys.intern(obj)
    if isinstance(obj, dict):
        out = type(obj)((_interned(k), _interned(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # a module's state_dict: its version numbers
            out._metadata = _interned(obj._metadata)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_interned(x) for x in obj)
    return obj


def _save(path: Path, obj: Any) -> str:
    """``torch.save`` of ``obj`` to ``path``, atomically and byte-reproducibly; returns the
    sha256 (hex) of the bytes written.

    Saved to a path, torch names the zip archive's folder after the file, which for an atomic
    write is a random temporary name: the same state would give other bytes on every save.
    Saved to a buffer, the folder is always ``archive``.
    """
    buffer = io.BytesIO()
    torch.save(_interned(obj), buffer)
    data = buffer.getvalue()
    fileio.write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(path: Path, model: GPT, optimizer: torch.optim.Optimizer,
                    model_cfg: ModelConfig, *, step: int, meta: dict) -> str:
    """Save ``model_cfg`` (as a dict), the weights, the optimizer state, ``step`` and ``meta``
    to ``path`` atomically; the same state always gives the same bytes. Returns their sha256
    (hex), which :func:`verify_checkpoint` checks the file against later."""
    return _save(path, {"model_config": model_cfg.to_dict(), "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(), "step": step, "meta": meta})


def verify_checkpoint(path: Path, sha256: str | None) -> str | None:
    """Why the checkpoint at ``path`` cannot be trusted, or None when it can: it exists and its
    bytes have the ``sha256`` (hex) recorded when it was written (None: nothing was recorded,
    as by versions before the record existed)."""
    if not path.is_file():
        return f"{path} is missing"
    if not sha256:
        return f"{path} has no recorded sha256 to check it against"
    if fileio.sha256_file(path) != sha256:
        return (f"{path} ({path.stat().st_size:,} bytes) does not match the sha256 recorded "
                f"when it was written (truncated or changed since)")
    return None


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> tuple[GPT, dict]:
    """Rebuild the GPT saved by :func:`save_checkpoint` on ``device``.

    Returns:
        ``(model in eval mode, the checkpoint dict)``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataError: ``path`` is not a readable checkpoint (truncated, corrupted, another format);
            the message names it.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
        model_cfg = ModelConfig(**ckpt["model_config"])
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, pickle errors, ...
        first = (str(exc).splitlines() or [""])[0][:200]
        raise DataError(f"{path} is not a readable checkpoint ({type(exc).__name__}: {first}); "
                        "delete it and run lmablate train (or dvc repro) again") from None
    model = GPT(model_cfg).to(device)
    model.load_state_dict(ckpt["model"])
    model.eval()
    return model, ckpt


def save_resume(path: Path, state: dict[str, Any]) -> None:
    """Write a resume state (a dict holding at least ``fingerprint``) to ``path`` atomically."""
    _save(path, state)


def load_resume(path: Path | None, fingerprint: str) -> dict | None:
    """The resume state at ``path`` if it exists, is readable and was written for
    ``fingerprint``; else None (training then starts over)."""
    if path is None or not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001 - an unreadable state is ignored, training starts over
        return None
    return state if state.get("fingerprint") == fingerprint else None
