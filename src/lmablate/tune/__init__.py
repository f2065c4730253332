"""Tuning: each variant's learning rate and width, proposed by an Optuna study in rungs of
growing budget (:mod:`~lmablate.tune.tuning`, pure functions of config and results), run as
trials, and bracketed at the full budget (:mod:`~lmablate.tune.lr_minimum`)."""
