"""Fixtures of the kernel tests: kernels_v2 compiled for the MSL CPU harness.

Compiled libraries are cached under build/msl_harness by a hash of the
generated C++, so only the first run after a kernel change compiles (about
half a minute on two cores).
"""

from __future__ import annotations

import pytest

from tools.msl_harness import compile_kernels
from vllm_metal.native import get_ops


@pytest.fixture(scope="session")
def kernels():
    """{file stem: MslLibrary} for every kernels_v2/*.metal."""
    return compile_kernels()


@pytest.fixture(scope="session")
def ext():
    return get_ops()
