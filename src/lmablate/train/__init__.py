"""Training at equal compute: a FLOPs budget turned into steps, one seed or a batch of seeds
trained, checkpoints and resume states, and the device with its measured numerics."""
