"""lmablate.train.training: the optimizer and its weight decay, the learning-rate schedule, one
training step, and the training loop resumed from a saved state."""

from __future__ import annotations

import pytest
import torch

from lmablate.config.study import ModelConfig, TrainConfig
from lmablate.data.token_data import TokenData
from lmablate.model.gpt import GPT
from lmablate.model.variants import resolve_model_config
from lmablate.train.training import (decayed_parameter_names, gradient_stats, make_optimizer,
                               make_scheduler, train_model, train_step)

CPU = torch.device("cpu")
TINY = ModelConfig(vocab_size=11, context_length=8, n_layers=1, n_heads=2, d_model=16)


def tiny_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (4, 8) of a vocabulary of 11 and their next tokens as targets (4, 8)."""
    x = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(seed))
    return x[:, :-1], x[:, 1:]


def test_a_few_training_steps_on_one_tiny_batch_reduce_its_loss():
    torch.manual_seed(0)
    model = GPT(TINY)
    opt = make_optimizer(model, TrainConfig(), 1e-2, CPU)
    x, y = tiny_batch()
    losses = [train_step(model, opt, None, x, y, grad_clip=1.0, device=CPU) for _ in range(20)]
    assert all(isinstance(v, float) for v in losses)
    assert losses[-1] < losses[0] - 0.5  # nats/char: it learns the batch by heart


def test_weight_decay_falls_on_linear_weight_matrices_only():
    torch.manual_seed(0)
    model = GPT(TINY)
    decayed = decayed_parameter_names(model)
    params = dict(model.named_parameters())
    assert decayed and all(params[n].dim() == 2 for n in decayed)
    assert not any(n.startswith(("wte", "position")) or n.endswith("bias") for n in decayed)
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1), 1e-3, CPU)
    by_decay = {g["weight_decay"]: {id(p) for p in g["params"]} for g in opt.param_groups}
    assert by_decay[0.1] == {id(params[n]) for n in decayed}
    assert by_decay[0.0] == {id(p) for n, p in params.items() if n not in decayed}


def test_a_weight_tied_to_the_embedding_is_not_decayed():
    model = GPT(ModelConfig(**{**TINY.to_dict(), "tie_weights": True}))
    assert model.lm_head.weight is model.wte.weight
    assert not {n for n, p in model.named_parameters() if p is model.wte.weight} & \
        decayed_parameter_names(model)


def test_the_schedule_warms_up_linearly_then_decays_to_a_tenth_of_the_peak():
    steps, peak = 20, 1e-2
    cfg = TrainConfig(warmup_fraction=0.1, lr_schedule="cosine")
    opt = make_optimizer(GPT(TINY), cfg, peak, CPU)
    sched = make_scheduler(opt, cfg, steps)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    warmup = cfg.warmup_steps(steps)
    assert warmup == 2 and lrs[0] == pytest.approx(1e-3 * peak)
    assert lrs[:warmup + 1] == sorted(lrs[:warmup + 1])  # rising to the peak
    assert max(lrs) == pytest.approx(peak)
    assert lrs[warmup:] == sorted(lrs[warmup:], reverse=True)  # then only falling
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * peak)


def test_gradient_stats_has_one_row_per_parameter_group_after_a_backward_pass():
    torch.manual_seed(0)
    model = GPT(TINY)
    opt = make_optimizer(model, TrainConfig(), 1e-3, CPU)
    train_step(model, opt, None, *tiny_batch(), grad_clip=0.0, device=CPU)
    rows = gradient_stats(model)
    groups = {name.rsplit(".", 1)[0] for name, _ in model.named_parameters()}
    assert {r["group"] for r in rows} == groups
    assert all(0.0 <= r["frac_near_zero"] <= 1.0 and r["grad_norm"] >= 0.0 for r in rows)


@pytest.fixture()
def project(make_project, tmp_path):
    """A tiny project whose runs validate every 10 steps and warm up over a tenth of them."""
    return make_project(tmp_path, {"study": {"variants": ["baseline"]},
                                   "train": {"eval_interval": 10, "warmup_fraction": 0.1}})


def test_resume_in_process_equals_uninterrupted(project):
    cfg, project = project.cfg, project.path
    data = TokenData.load(project / "tokens")
    model_cfg = resolve_model_config(cfg, "baseline", data.vocab_size, 16)
    kw = dict(seed=0, lr=3e-3, steps=60, device=torch.device("cpu"))
    train_cfg = cfg.train
    full = train_model(model_cfg, train_cfg, data, **kw)

    class Crash(Exception):
        pass

    def crash_at_30(step, _):
        if step == 30:
            raise Crash

    state = project / "resume.pt"
    with pytest.raises(Crash):
        train_model(model_cfg, train_cfg, data, **kw, resume_path=state, fingerprint="f",
                    on_eval=crash_at_30)
    assert torch.load(state, weights_only=False)["step"] == 30
    resumed = train_model(model_cfg, train_cfg, data, **kw, resume_path=state, fingerprint="f")
    assert [r["val_loss"] for r in resumed.history] == pytest.approx(
        [r["val_loss"] for r in full.history], abs=1e-6)
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # a state written for other settings is not resumed
    other = train_model(model_cfg, train_cfg, data, **kw, resume_path=state, fingerprint="g")
    assert other.history[0]["step"] == 10
