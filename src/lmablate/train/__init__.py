"""Training at equal compute: one seed or a batch of seeds, checkpoints, the device and its numerics."""
