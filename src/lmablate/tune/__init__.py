"""Tuning: the learning rate and width of each variant, chosen by an Optuna study and a full-budget bracket."""
