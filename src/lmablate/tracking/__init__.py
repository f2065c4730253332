"""Tracking: every run, trial and summary recorded in MLflow."""
