"""Soak benchmark: a long mixed load against one server, its memory sampled as it runs."""
