"""Side-by-side throughput benchmarks: each is ``python -m benchmarks.NAME``."""
