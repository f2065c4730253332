"""Tracking: every trial, run and study summary recorded in MLflow, through one store
(:mod:`~lmablate.tracking.mlflow_store`), optionally from a child process, with what each result
was computed with (:mod:`~lmablate.tracking.environment`)."""
