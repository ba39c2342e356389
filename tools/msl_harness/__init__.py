"""MSL CPU harness: compile real .metal files as C++ and run them with exact SIMD-group semantics.

See docs/kernels.md ("Verifying Metal on Linux") for what it proves and what it cannot.
"""

from .library import LaunchResult, MslLibrary, MslRuntimeError, default_cxx
from .project import KERNELS_DIR, compile_kernels, kernel_defines
from .translate import MslCompileError

__all__ = ["KERNELS_DIR", "LaunchResult", "MslCompileError", "MslLibrary", "MslRuntimeError",
           "compile_kernels", "default_cxx", "kernel_defines"]
