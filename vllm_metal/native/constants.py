"""Kernel constants: the single source for Python, the C++ extension and Metal.

CMake reads this file with a regex (csrc/CMakeLists.txt) and passes the values as
compile-time macros, so keep each assignment on one line in this literal form.
"""

# KV partition length (tokens) for split-KV attention over long contexts.
PARTITION_SIZE = 512

# Page sizes (tokens per KV block) the kernels are instantiated for.
KERNEL_BLOCK_SIZES = (32, 16, 8)
