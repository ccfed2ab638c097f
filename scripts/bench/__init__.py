"""Benchmark and measurement harnesses (JSON out, with the environment they ran in)."""
