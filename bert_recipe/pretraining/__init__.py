"""Pre-training: its flags, the HDF5 shard format and writer, the data stream, the Trainer."""
