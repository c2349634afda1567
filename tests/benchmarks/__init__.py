"""Benchmarks: programs that print tables and measure peers in the same run (not tests; see README.md)."""
