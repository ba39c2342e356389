"""CMake options that build llama.cpp's CPU backend for this host's instruction sets.

`-DGGML_NATIVE=ON` compiles with `-march=native`, and on the x86 VMs these benchmarks
run on that build enables AMX paths the hypervisor does not let a process use: the
server dies of SIGILL at its first matmul. So on x86 Linux the options name each
extension /proc/cpuinfo reports (AVX-512 and VNNI included), with AMX off; elsewhere
(macOS, Arm) the native build is what users run.
"""

from __future__ import annotations

import platform
from pathlib import Path

# GGML option -> the /proc/cpuinfo flag that allows it.
_X86_OPTIONS = {
    "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma", "GGML_F16C": "f16c",
    "GGML_AVX_VNNI": "avx_vnni", "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi",
    "GGML_AVX512_VNNI": "avx512_vnni", "GGML_AVX512_BF16": "avx512_bf16",
}
_AMX_OFF = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags of the first processor in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def ggml_cpu_options(machine: str | None = None, cpuinfo: str | None = None) -> list[str]:
    """-D options for llama.cpp's CPU backend on this host (arguments: for tests)."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return ["-DGGML_NATIVE=ON"]
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.exists():
            return ["-DGGML_NATIVE=ON"]
        cpuinfo = path.read_text()
    flags = cpu_flags(cpuinfo)
    return (["-DGGML_NATIVE=OFF"]
            + [f"-D{option}={'ON' if flag in flags else 'OFF'}"
               for option, flag in _X86_OPTIONS.items()]
            + _AMX_OFF)
