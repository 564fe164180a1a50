"""Helpers of benchmarks/bench_peers.py: peer virtualenvs, runners (run in the peers' own pythons), report."""
