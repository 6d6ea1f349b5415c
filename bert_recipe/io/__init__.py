"""Input and output: the one-line error contract, every command's flags (flags.py), atomic writes, checkpoints,
downloads."""
