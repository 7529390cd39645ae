"""ttyserve's benchmark suite: `make bench`, or `python -m benchmarks.run --help`."""
