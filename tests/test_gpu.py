"""The CUDA path of the batched seeds (lmablate.train.batched on a GPU): the CUDA graph replays the
eager step bit for bit, two runs give the same bits, and each seed follows its run alone to
bf16 rounding. Skipped where no CUDA device is present (CI has none); run on a lent GPU with
``pytest tests/test_gpu.py`` (it needs neither MLflow nor Optuna)."""

from contextlib import nullcontext

import pytest
import torch
from lmablate.data.token_data import TokenData
from lmablate.model.variants import resolve_model_config
from lmablate.train.batched import train_seeds
from lmablate.train.training import train_model

from conftest import budgets
from trajectory import assert_same_trajectory

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

STEPS = 12
SMALL = {"train": {"budget_flops": budgets(STEPS), "eval_interval": 4, "eval_iters": 10,
                   "warmup_fraction": 0.1}}
LR = 3e-3
# bf16 autocast: one seed alone multiplies (B*T, C) matrices, the batched model (S, B*T, C)
# ones, and cuBLAS may round those differently in bf16. Only the losses are compared there: the
# weights drift apart under AdamW, whose update of a weight with a near-zero gradient is about
# +-lr whatever the gradient's size, so a rounding that flips that gradient's sign moves the
# weight by 2 * lr per step (measured on an H100 after 12 steps at lr 3e-3: biases, which start
# at zero, up to 50% apart in norm while the losses agree to 3e-4). The weights are compared in
# fp32 (autocast off), to the CPU test's tolerances.
BF16_LOSS_TOL = 2e-3


@pytest.fixture(scope="module")
def project(tmp_path_factory, make_project):
    tmp = tmp_path_factory.mktemp("gpu")
    project = make_project(tmp, SMALL)
    return project.cfg, TokenData.load(tmp / "tokens")


def weights(result):
    return {k: v.detach().cpu() for k, v in result.model.state_dict().items()}


@pytest.mark.parametrize("variant", ["baseline", "llama", "alibi"])
def test_the_cuda_graph_replays_the_eager_step_bit_for_bit_and_twice_the_same(project,
                                                                              variant):
    cfg, data = project
    mc = resolve_model_config(cfg, variant, data.vocab_size, 32)
    cuda = torch.device("cuda")
    runs = [train_seeds(mc, cfg.train, data, seeds=[0, 1, 2], lr=LR, steps=STEPS, device=cuda,
                        cuda_graph=graph) for graph in (False, True, True)]
    eager, graphed, again = runs
    for a, b, c in zip(eager, graphed, again):
        strip = [{k: v for k, v in row.items() if k != "elapsed_seconds"} for row in a.history]
        assert [{k: v for k, v in row.items() if k != "elapsed_seconds"}
                for row in b.history] == strip
        assert [{k: v for k, v in row.items() if k != "elapsed_seconds"}
                for row in c.history] == strip
        wa, wb, wc = weights(a), weights(b), weights(c)
        for k in wa:
            assert torch.equal(wa[k], wb[k]) and torch.equal(wa[k], wc[k]), k
    assert eager[0].val_loss != eager[1].val_loss  # the seeds differ


@pytest.mark.parametrize("variant", ["baseline", "llama"])
def test_on_a_gpu_each_seed_follows_its_run_alone_to_bf16_rounding(project, variant):
    cfg, data = project
    mc = resolve_model_config(cfg, variant, data.vocab_size, 32)
    cuda = torch.device("cuda")
    together = train_seeds(mc, cfg.train, data, seeds=[0, 1], lr=LR, steps=STEPS, device=cuda)
    worst = 0.0
    for seed, result in zip([0, 1], together):
        alone = train_model(mc, cfg.train, data, seed=seed, lr=LR, steps=STEPS, device=cuda)
        assert [r["step"] for r in alone.history] == [r["step"] for r in result.history]
        for a, b in zip(alone.history, result.history):
            assert (a["tokens"], a["lr"]) == (b["tokens"], b["lr"])
            for key in ("train_loss", "val_loss"):
                worst = max(worst, abs(a[key] - b[key]))
    print(f"{variant}: bf16, largest loss difference {worst:.2e}")
    assert worst < BF16_LOSS_TOL


@pytest.mark.parametrize("variant", ["baseline", "llama"])
def test_on_a_gpu_in_fp32_each_seed_follows_its_run_alone_to_fp32_rounding(project, variant,
                                                                          monkeypatch):
    """Autocast off (and TF32 off, PyTorch's default for matmuls): the CPU test's check, on
    CUDA, of losses, weights, optimizer moments and gradient norms."""
    for module in ("train.batched", "train.training", "evaluate.metrics"):
        monkeypatch.setattr(f"lmablate.{module}.autocast", lambda device: nullcontext())
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cfg, data = project
    mc = resolve_model_config(cfg, variant, data.vocab_size, 32)
    cuda = torch.device("cuda")
    together = train_seeds(mc, cfg.train, data, seeds=[0, 1], lr=LR, steps=STEPS, device=cuda)
    for seed, result in zip([0, 1], together):
        alone = train_model(mc, cfg.train, data, seed=seed, lr=LR, steps=STEPS, device=cuda)
        assert_same_trajectory(alone, result)
