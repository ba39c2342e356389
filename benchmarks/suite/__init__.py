"""Side-by-side serving benchmark: our server and its peers under one `vllm bench serve` workload.

Entry point: benchmarks/run_suite.py. Each peer installs on demand into its own
environment under a cache root and is reused on later runs.
"""
