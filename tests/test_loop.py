"""lmablate.train.loop.train_loop with a stand-in stepper: the schedule of segments and evaluations,
the divergence check of losses read late, and resuming after a state's step."""

import math

import pytest
import torch
from lmablate.train.loop import DivergenceError, train_loop


class Log:
    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, metrics))


class FakeStepper:
    """Two seeds; seed s's loss at step k is k + s/10, read only at the segment's end."""

    names_seeds = True

    def __init__(self, nan_at=None):
        self.seeds, self.nan_at, self.segments, self.steps = [3, 4], nan_at, [], []
        self.models = [torch.nn.Linear(2, 1) for _ in self.seeds]

    def begin_segment(self, first, last):
        self.segments.append((first, last))
        self.pending = []

    def step(self, step):
        self.steps.append(step)
        self.pending.append([math.nan if step == self.nan_at and s == 1 else step + s / 10
                             for s in range(2)])

    def segment_losses(self):
        return self.pending

    def evaluate(self):
        return [float(self.steps[-1]), float(self.steps[-1]) + 1]

    def lr(self):
        return 0.5

    def snapshot(self):
        return lambda s: {"model": {}, "optimizer": {}, "scheduler": {}, "rng_train": None}

    def finish(self):
        return [(m, None) for m in self.models]


def run(stepper, states=(None, None), **kw):
    return train_loop(stepper, steps=10, eval_interval=4, tokens_per_step=8, lr=0.5,
                      states=list(states), trackers=[Log(), Log()], desc="d",
                      resume_paths=[None, None], fingerprints=["", ""],
                      resume_meta=[None, None], **kw)


def test_segments_end_at_each_evaluation_and_rows_average_their_losses():
    stepper, evals = FakeStepper(), []
    results = run(stepper, on_eval=lambda step, losses: evals.append((step, losses)))
    assert stepper.segments == [(1, 4), (5, 8), (9, 10)]
    assert stepper.steps == list(range(1, 11))
    assert evals == [(4, [4.0, 5.0]), (8, [8.0, 9.0]), (10, [10.0, 11.0])]
    assert [r["step"] for r in results[1].history] == [4, 8, 10]
    assert results[1].history[0]["train_loss"] == pytest.approx(2.6)  # mean of 1.1 .. 4.1
    assert results[0].history[-1]["tokens"] == 80 and results[0].val_loss == 10.0


def test_a_loss_read_late_is_checked_before_the_evaluation_is_recorded():
    with pytest.raises(DivergenceError, match=r"d, seed 4: training loss is nan at step 6 "
                                              r"\(lr=0\.5\)") as info:
        run(FakeStepper(nan_at=6))
    assert info.value.seed == 4


def test_a_resumed_run_starts_after_the_states_step_with_their_rows():
    row = {"seed": 3, "step": 4, "tokens": 32, "train_loss": 1.0, "val_loss": 2.0, "lr": 0.5,
           "elapsed_seconds": 1.0}
    states = [{"step": 4, "history": [row], "train_time": 7.0}] * 2
    stepper = FakeStepper()
    results = run(stepper, states=states)
    assert stepper.segments == [(5, 8), (9, 10)]
    assert [r["step"] for r in results[0].history] == [4, 8, 10]
    assert results[0].train_seconds >= 7.0
