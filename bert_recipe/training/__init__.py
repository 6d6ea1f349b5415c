"""The training core both recipes use: processes, precision, parallelism, the step, the meter."""
