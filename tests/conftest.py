import os

import pytest

# The engines the tests start serve tiny checkpoints with a few thousand tokens of
# context, and committing the default 4 GiB KV pool (zeroed and resident from
# startup) cost each start ~3 s on a host reading memory at 16 GB/s; 0.5 GiB holds
# them all (the cap still grows to one --max-model-len request) and the cap's own
# tests set theirs.
os.environ.setdefault("VLLM_METAL_CPU_KV_CACHE_GIB", "0.5")


@pytest.fixture
def exact_arithmetic(monkeypatch):
    """The CPU backend's fast path switched off (VLLM_METAL_CPU_INT8_ACTIVATIONS=0):
    quantized checkpoints compute in float32, as mlx-lm does, for the tests that
    hold them to mlx-lm's float32 forward. The default mode has its own tests
    (tests/e2e/test_default_mode.py, test_default_accuracy.py)."""
    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "0")

