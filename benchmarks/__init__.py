"""shmload benchmarks: `python -m benchmarks.run --help`."""
