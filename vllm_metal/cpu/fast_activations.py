"""Route MLX's GELU and SiLU functions to the extension's CPU kernels while an
encoder's graph is built (vision towers: mlx-vlm's modules call ``nn.gelu`` /
``nn.gelu_approx`` / ``nn.gelu_fast_approx`` / ``nn.silu``, or ``nn.GELU`` modules
that look the function up at call time).

MLX's CPU backend computes erf, tanh and exp one element at a time: GELU took
86 ms a layer on a Qwen2-VL tower's [1024, 5120] activation here, 2.7 s of the
tower. Calls on other dtypes go to MLX's own functions (vllm_metal.ops.activations).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import mlx.nn as nn
from mlx.nn.layers import activations as mlx_activations

from vllm_metal.ops import activations

_NAMES = ("gelu", "gelu_approx", "gelu_fast_approx", "silu")


@contextlib.contextmanager
def fast_activations() -> Iterator[None]:
    """Within the block, mlx.nn's GELUs and SiLU run the CPU kernels."""
    saved = {(owner, name): getattr(owner, name)
             for owner in (nn, mlx_activations) for name in _NAMES}
    for owner, name in saved:
        setattr(owner, name, getattr(activations, name))
    try:
        yield
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)
