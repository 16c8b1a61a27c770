"""Benchmarks (not tests): run by `make bench` or `python -m bench.<name>`."""
