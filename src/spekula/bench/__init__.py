"""Workloads, the benchmark runner, tune, audit and reports."""
