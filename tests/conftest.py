import pytest


@pytest.fixture
def exact_arithmetic(monkeypatch):
    """The CPU backend's fast path switched off (VLLM_METAL_CPU_INT8_ACTIVATIONS=0):
    quantized checkpoints compute in float32, as mlx-lm does, for the tests that
    hold them to mlx-lm's float32 forward. The default mode has its own tests
    (tests/e2e/test_default_mode.py, test_default_accuracy.py)."""
    monkeypatch.setenv("VLLM_METAL_CPU_INT8_ACTIVATIONS", "0")
