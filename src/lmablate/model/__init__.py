"""The model every ablation trains: a small GPT whose components are swapped by name."""
