"""Benchmarks for Tenure (not tests): see ``bench.broker_bench`` and docs/benchmarks.md."""
