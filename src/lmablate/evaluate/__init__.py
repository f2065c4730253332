"""Evaluation: test metrics of a trained model and the answer probe of the arithmetic task."""
