"""Run the extension's CPU kernels under a lowered instruction set (tests)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from vllm_metal.native import get_ops


@contextmanager
def cpu_isa(name: str):
    """Run the CPU kernels with instruction set `name` (skips if the CPU lacks it)."""
    ext = get_ops()
    original = ext.cpu_isa()
    try:
        ext.debug.set_cpu_isa(name)
    except ValueError:
        pytest.skip(f"this CPU has no {name}")
    try:
        yield
    finally:
        ext.debug.set_cpu_isa(original)
