"""lmablate.train.checkpoint: checkpoints that load back the model they saved, byte for byte the
same on every save; damaged ones refused by name; resume states returned only for their own
settings."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
import torch

import lmablate
from lmablate.config.study import ModelConfig, TrainConfig
from lmablate.core.fingerprint import RUN_CODE, code_version
from lmablate.core.validation import DataError
from lmablate.model.gpt import GPT
from lmablate.train.checkpoint import (load_checkpoint, load_resume, save_checkpoint, save_resume,
                                 verify_checkpoint)
from lmablate.train.training import make_optimizer, train_step

CPU = torch.device("cpu")
TINY = ModelConfig(vocab_size=11, context_length=8, n_layers=1, n_heads=2, d_model=16,
                   position="rope", norm="rmsnorm")


def trained_model() -> tuple[GPT, torch.optim.Optimizer]:
    """A tiny GPT after two optimizer steps, and its optimizer (with state to save)."""
    torch.manual_seed(0)
    model = GPT(TINY)
    opt = make_optimizer(model, TrainConfig(), 1e-2, CPU)
    x = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        train_step(model, opt, None, x, x.roll(-1, 1), grad_clip=1.0, device=CPU)
    return model, opt


def test_a_saved_checkpoint_loads_back_the_same_model_in_eval_mode(tmp_path):
    model, opt = trained_model()
    path = tmp_path / "seed_0" / "checkpoint.pt"
    save_checkpoint(path, model, opt, TINY, step=2, meta={"seed": 0, "lr": 1e-2})
    loaded, ckpt = load_checkpoint(path)
    assert not loaded.training and loaded.cfg == TINY
    assert (ckpt["step"], ckpt["meta"]) == (2, {"seed": 0, "lr": 1e-2})
    for (name, a), (other, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == other and torch.equal(a, b), name
    x = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(2))
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x)[0], loaded(x)[0])
    assert ckpt["optimizer"]["state"]  # the optimizer's moments travel with it


def test_the_same_state_saved_twice_gives_the_same_bytes_and_the_sha256_of_the_file(tmp_path):
    model, opt = trained_model()
    first = save_checkpoint(tmp_path / "a.pt", model, opt, TINY, step=2, meta={})
    second = save_checkpoint(tmp_path / "b.pt", model, opt, TINY, step=2, meta={})
    data = (tmp_path / "a.pt").read_bytes()
    assert data == (tmp_path / "b.pt").read_bytes()
    assert first == second == hashlib.sha256(data).hexdigest()
    assert verify_checkpoint(tmp_path / "a.pt", first) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt"]  # no temporary left


def test_a_state_read_back_from_a_file_saves_to_the_same_bytes_as_the_one_it_came_from(tmp_path):
    """As a run resumed from resume.pt does: the optimizer's state keys are then strings read
    from the file, not torch's own constants, and must not change the checkpoint's bytes."""
    model, opt = trained_model()
    save_checkpoint(tmp_path / "a.pt", model, opt, TINY, step=2, meta={"seed": 0})
    again = make_optimizer(model, TrainConfig(), 1e-2, CPU)
    again.load_state_dict(torch.load(tmp_path / "a.pt", weights_only=True)["optimizer"])
    key = next(iter(again.state_dict()["state"][0]))
    assert key == "step" and key is not sys.intern("step")  # an equal string, another object
    save_checkpoint(tmp_path / "b.pt", model, again, TINY, step=2, meta={"seed": 0})
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()


def test_a_truncated_checkpoint_is_refused_naming_the_file(tmp_path):
    model, opt = trained_model()
    path = tmp_path / "checkpoint.pt"
    sha = save_checkpoint(path, model, opt, TINY, step=2, meta={})
    os.truncate(path, 1000)
    assert verify_checkpoint(path, sha) == (
        f"{path} (1,000 bytes) does not match the sha256 recorded when it was written "
        "(truncated or changed since)")
    with pytest.raises(DataError, match=rf"^{path} is not a readable checkpoint"):
        load_checkpoint(path)


def test_a_missing_or_unrecorded_checkpoint_is_not_trusted(tmp_path):
    path = tmp_path / "checkpoint.pt"
    assert verify_checkpoint(path, "0" * 64) == f"{path} is missing"
    with pytest.raises(FileNotFoundError, match="not found"):
        load_checkpoint(path)
    model, opt = trained_model()
    save_checkpoint(path, model, opt, TINY, step=2, meta={})
    assert verify_checkpoint(path, None) == f"{path} has no recorded sha256 to check it against"


def test_a_resume_state_is_returned_only_for_the_fingerprint_it_was_written_for(tmp_path):
    path = tmp_path / "resume.pt"
    assert load_resume(None, "f") is None and load_resume(path, "f") is None
    state = {"fingerprint": "f", "step": 30, "history": [{"step": 10, "val_loss": 2.5}],
             "weights": torch.arange(6.0)}
    save_resume(path, state)
    got = load_resume(path, "f")
    assert got["step"] == 30 and got["history"] == state["history"]
    assert torch.equal(got["weights"], state["weights"])
    assert load_resume(path, "g") is None  # other settings, data or code: start over
    path.write_bytes(path.read_bytes()[:100])
    assert load_resume(path, "f") is None  # unreadable: start over


def test_the_code_version_of_a_package_is_the_hash_of_every_module_under_it():
    version = code_version()
    assert len(version) == 16 and int(version, 16) >= 0
    assert version == code_version(RUN_CODE)
    package = Path(lmablate.__file__).parent
    modules = tuple(p.relative_to(package).as_posix()
                    for part in RUN_CODE for p in sorted((package / part).rglob("*.py")))
    assert len(modules) > len(RUN_CODE)
    assert code_version(modules) == version  # a folder stands for its modules, in sorted order
    assert code_version(RUN_CODE[:1]) != version != code_version(RUN_CODE + ("tune",))


def test_a_code_version_of_a_part_that_does_not_exist_is_an_error():
    with pytest.raises(FileNotFoundError, match="nosuch"):
        code_version(("model", "nosuch"))
