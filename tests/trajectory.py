"""The check shared by the CPU and GPU tests of the batched seeds: one seed's trajectory in a
batched run against the same seed trained alone."""

import pytest
import torch

# fp32 rounding: batched matmuls and reductions may add in another order than one seed's
LOSS_TOL, WEIGHT_TOL = 1e-5, 2e-5


def assert_same_trajectory(alone, together, loss_tol=LOSS_TOL, weight_tol=WEIGHT_TOL):
    """Two TrainResults of one seed: same eval steps, lr and tokens; losses, weights, optimizer
    moments and gradient statistics within fp32 tolerance."""
    assert [r["step"] for r in alone.history] == [r["step"] for r in together.history]
    for a, b in zip(alone.history, together.history):
        assert (a["seed"], a["tokens"], a["lr"]) == (b["seed"], b["tokens"], b["lr"])
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=loss_tol)
        assert b["val_loss"] == pytest.approx(a["val_loss"], abs=loss_tol)
    wa, wb = alone.model.state_dict(), together.model.state_dict()
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=weight_tol, rtol=0, msg=k)
    oa, ob = alone.optimizer.state_dict(), together.optimizer.state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    for i, state in oa["state"].items():
        assert state.keys() == ob["state"][i].keys()
        for k, v in state.items():
            torch.testing.assert_close(ob["state"][i][k], v, atol=weight_tol, rtol=0)
    assert [g["group"] for g in alone.grad_stats] == [g["group"] for g in together.grad_stats]
    for a, b in zip(alone.grad_stats, together.grad_stats):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3, abs=1e-6)
