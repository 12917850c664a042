"""Benchmark harness of infergate (``infergate bench``)."""
