"""Input and output: the one-line error contract, flags, atomic writes, checkpoints, downloads."""
