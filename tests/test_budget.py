"""Equal training compute: a dataset's FLOPs budget turned into each run's step count."""

import pytest

from lmablate.config.study import ConfigError, ModelConfig
from lmablate.model.gpt import flops_per_token
from lmablate.train.budget import run_steps, steps_for_budget, training_flops, trial_steps
from lmablate.tune.search_space import width_ladder

from conftest import PROFILES, profile_config


@pytest.mark.parametrize("name", PROFILES)
def test_every_final_run_of_a_shipped_profile_spends_its_budget_within_one_percent(name):
    """...at every width its tuning may search, and every tuning trial its rung's share within
    half a step (the lowest rung's trials are short: tune.min_steps is 30, where half a step is
    1.7%)."""
    study = profile_config(name)
    for ds, budget in ((d, b) for d in study.datasets for b in study.budgets(d)):
        cfg = study.at_budget(ds, budget)  # a scaling profile's every budget
        widths = cfg.tune.d_model_choices or width_ladder(cfg, ds)
        for variant in cfg.study_variants:
            for d_model in widths:
                model = cfg.model_config(variant, vocab_size=65, d_model=d_model)
                final = training_flops(model, cfg.train.batch_size, run_steps(cfg, ds, model))
                assert abs(final / budget - 1) < 0.01, (ds, variant, d_model)
                per_step = training_flops(model, cfg.train.batch_size, 1)
                for _, share in cfg.tune.rungs:
                    trial = training_flops(model, cfg.train.batch_size,
                                           trial_steps(cfg, ds, model, share))
                    assert abs(trial - budget * share) <= per_step / 2, (ds, variant, d_model)


def test_a_narrower_model_trains_more_steps_on_the_same_budget():
    narrow, wide = ModelConfig(d_model=32), ModelConfig(d_model=96)
    budget = 1e11
    assert steps_for_budget(budget, narrow, 16) > 3 * steps_for_budget(budget, wide, 16)


def test_steps_round_to_the_closest_multiple():
    model = ModelConfig(d_model=64, context_length=64)
    per_step = 16 * 64 * flops_per_token(model)
    assert steps_for_budget(100.4 * per_step, model, 16) == 100
    assert steps_for_budget(100.6 * per_step, model, 16) == 101
    assert steps_for_budget(101 * per_step, model, 16, multiple_of=8) == 104
    assert training_flops(model, 16, 100) == 100 * per_step


def test_a_budget_that_buys_no_step_is_a_config_error():
    model = ModelConfig(d_model=64)
    with pytest.raises(ConfigError, match=r"train\.budget_flops=1e\+06 buys no final run of "
                                          r"d_model=64"):
        steps_for_budget(1e6, model, 16, what="final run")


def test_a_dataset_s_own_window_sets_its_runs_context_batch_and_steps():
    """datasets.arithmetic.context_length 16 and batch_size 64: every per-dataset view
    (for_dataset, at_budget) has them, text keeps the model's, and a run's steps follow from
    them: 1,024 tokens a step as text's, more steps since attention over 16 tokens is cheaper."""
    study = profile_config("default")
    arith = study.at_budget("arithmetic", study.budgets("arithmetic")[0])
    text = study.for_dataset("shakespeare")
    assert (arith.model.context_length, arith.train.batch_size) == (16, 64)
    assert (text.model.context_length, text.train.batch_size) == (64, 16)
    assert study.for_dataset("arithmetic").for_dataset("arithmetic") == study.for_dataset(
        "arithmetic")
    own = arith.model_config("baseline", vocab_size=17, d_model=24)
    wide = study.model_config("baseline", vocab_size=17, d_model=24)  # 64 tokens, batch 16
    budget = study.budgets("arithmetic")[0]
    assert run_steps(study, "arithmetic", own) == steps_for_budget(budget, own, 64)
    assert run_steps(study, "arithmetic", own) > steps_for_budget(budget, wide, 16)
    assert flops_per_token(own) < flops_per_token(wide)
