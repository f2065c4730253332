"""Evaluation of a trained model: test loss, perplexity and bits per character, arithmetic
exact match by operation and operand length, and the answer probe that training records.

A new metric of a trained model is computed in :mod:`~lmablate.evaluate.metrics` and written by
the evaluate stage; the report compares it in :mod:`lmablate.report`."""
