"""Compile a translated .metal file into a shared library and launch its kernels.

    lib = MslLibrary("kernels_v2/foo.metal", defines={"N": 4}, cache_dir="build/msl_harness")
    result = lib.dispatch("foo_float32", grid=(8, 1, 1), threads=(64, 1, 1),
                          buffers={0: x, 1: out}, constants={0: True}, order="reverse")

Buffers are numpy arrays (C-contiguous, written in place), numpy scalars or
structured records (passed like setBytes), or bytes. Compiled libraries are
cached by a hash of the generated C++, the prelude and the compiler flags.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .translate import (INCLUDE_DIR, MslCompileError, Translation, language_flags,
                        translate_file)

ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}
STAT_NAMES = ("fiber_switches", "collectives", "barriers", "divergent_collectives", "early_exits",
              "barrier_mismatches", "inactive_lane_reads", "threadgroups", "tensor_op_misuses")
# Counted problems a GPU would not report: any of them fails a strict launch.
PROBLEMS = ("divergent_collectives", "early_exits", "barrier_mismatches", "inactive_lane_reads",
            "tensor_op_misuses")
CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-w", "-pthread", "-fno-strict-aliasing")


class MslRuntimeError(RuntimeError):
    """A launch failed or showed behaviour a GPU leaves undefined."""


class _Constant(ctypes.Structure):
    _fields_ = [("index", ctypes.c_int32), ("pad", ctypes.c_int32), ("value", ctypes.c_double)]


class _Launch(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint32 * 3), ("threads", ctypes.c_uint32 * 3),
        ("buffers", ctypes.POINTER(ctypes.c_void_p)), ("num_buffers", ctypes.c_int32),
        ("num_tg_mem", ctypes.c_int32), ("tg_mem_bytes", ctypes.POINTER(ctypes.c_uint64)),
        ("constants", ctypes.POINTER(_Constant)), ("num_constants", ctypes.c_int32),
        ("order", ctypes.c_int32), ("seed", ctypes.c_uint32), ("workers", ctypes.c_int32),
        ("stack_kib", ctypes.c_int32), ("num_guard", ctypes.c_int32),
        ("guard_lo", ctypes.POINTER(ctypes.c_uint64)), ("guard_hi", ctypes.POINTER(ctypes.c_uint64)),
        ("stats", ctypes.c_int64 * len(STAT_NAMES)), ("error", ctypes.c_char * 1024),
    ]


class _Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("body", ctypes.c_void_p),
                ("buffers", ctypes.c_char_p), ("threadgroups", ctypes.c_char_p)]


@dataclass
class LaunchResult:
    stats: dict[str, int]
    error: str
    seconds: float


def default_cxx() -> str:
    return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++") or "c++"


def _compiler_id(cxx: str) -> str:
    result = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.splitlines()[0] if result.stdout else cxx


def _prelude_text() -> str:
    return "".join(p.read_text() for p in sorted(INCLUDE_DIR.glob("*.h")))


class MslLibrary:
    """One .metal file compiled for the CPU harness."""

    def __init__(self, path: str | os.PathLike, defines: dict[str, object] | None = None,
                 cache_dir: str | os.PathLike | None = None, cxx: str | None = None,
                 extra_flags: tuple[str, ...] = ()):
        self.path = Path(path)
        self.cxx = cxx or default_cxx()
        self.defines = dict(defines or {})
        self.translation: Translation = translate_file(self.path, self.defines, self.cxx)
        standard = tuple(f for f in language_flags(self.path) if f.startswith("-std="))
        flags = (*CXX_FLAGS, *standard, *extra_flags, f"-I{INCLUDE_DIR}")
        key = hashlib.sha256("\0".join(
            (self.translation.cpp, _prelude_text(), _compiler_id(self.cxx), *flags)).encode()).hexdigest()[:20]
        cache = Path(cache_dir) if cache_dir else Path(tempfile.gettempdir()) / "msl_harness"
        cache.mkdir(parents=True, exist_ok=True)
        self.so_path = cache / f"{self.path.stem}-{key}.so"
        self.cpp_path = cache / f"{self.path.stem}-{key}.cpp"
        self.cached = self.so_path.exists()
        if not self.cached:
            self._compile(flags)
        self._lib = ctypes.CDLL(str(self.so_path))
        self._lib.msl_hx_run.argtypes = [ctypes.POINTER(_Launch), ctypes.c_int]
        self._lib.msl_hx_run.restype = ctypes.c_int
        count = ctypes.c_int.in_dll(self._lib, "msl_hx_num_entries").value
        table = (_Entry * (count + 1)).in_dll(self._lib, "msl_hx_entries")
        self._entries: dict[str, tuple[int, list[int], list[int]]] = {}
        for i in range(count):
            e = table[i]
            self._entries[e.name.decode()] = (i, _indices(e.buffers), _indices(e.threadgroups))
        self.function_constants = {fc.index: fc.name for fc in self.translation.function_constants}

    def _compile(self, flags: tuple[str, ...]) -> None:
        self.cpp_path.write_text(self.translation.cpp)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=self.so_path.parent)
        os.close(fd)
        result = subprocess.run([self.cxx, *flags, str(self.cpp_path), "-o", tmp],
                                capture_output=True, text=True, check=False)
        if result.returncode:
            os.unlink(tmp)
            raise MslCompileError(f"compiling {self.path.name} as C++ failed:\n{result.stderr[-6000:]}")
        os.replace(tmp, self.so_path)  # atomic: parallel test processes may race

    @property
    def kernels(self) -> list[str]:
        """Host names of every kernel entry (plain kernels and instantiations)."""
        return list(self._entries)

    def dispatch(self, kernel: str, grid, threads, buffers: dict[int, object],
                 constants: dict[int, object] | None = None,
                 threadgroup_memory: dict[int, int] | None = None, order: str = "forward",
                 seed: int = 0, workers: int | None = None, guard: bool = False,
                 strict: bool = True, stack_kib: int = 64) -> LaunchResult:
        """Run `kernel` over grid (threadgroups) x threads (per threadgroup).

        strict: raise MslRuntimeError on divergent collectives, barriers after
        early returns, mismatched barriers or reads of inactive lanes.
        guard: buffers end at an inaccessible page and the launch runs in a
        forked child, so an out-of-bounds access raises (naming the buffer and
        thread) instead of corrupting memory.
        """
        if kernel not in self._entries:
            raise KeyError(f"{kernel!r} is not a kernel of {self.path.name}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {sorted(ORDERS)}, got {order!r}")
        index, needed, tg_needed = self._entries[kernel]
        missing = [n for n in needed if n not in buffers]
        if missing:
            raise ValueError(f"{kernel}: buffers {missing} are not bound")
        tg_memory = dict(threadgroup_memory or {})
        if [n for n in tg_needed if n not in tg_memory]:
            raise ValueError(f"{kernel}: threadgroup memory {tg_needed} needs sizes")
        arrays = {n: _as_array(b) for n, b in buffers.items()}
        launch = _Launch()
        launch.grid[:] = _dims(grid)
        launch.threads[:] = _dims(threads)
        launch.order = ORDERS[order]
        launch.seed = seed
        launch.workers = workers or os.cpu_count() or 1
        launch.stack_kib = stack_kib
        consts = [(int(k), float(v)) for k, v in (constants or {}).items()]
        c_consts = (_Constant * max(1, len(consts)))(*[_Constant(k, 0, v) for k, v in consts])
        launch.constants, launch.num_constants = c_consts, len(consts)
        num_tg = max(tg_memory) + 1 if tg_memory else 0
        tg_sizes = (ctypes.c_uint64 * max(1, num_tg))()
        for n, size in tg_memory.items():
            tg_sizes[n] = size
        launch.tg_mem_bytes, launch.num_tg_mem = tg_sizes, num_tg
        count = max(arrays) + 1 if arrays else 0
        if guard:
            seconds, launch = self._run_guarded(index, launch, arrays, count)
        else:
            pointers = (ctypes.c_void_p * max(1, count))()
            for n, a in arrays.items():
                pointers[n] = a.ctypes.data
            launch.buffers, launch.num_buffers = pointers, count
            seconds = self._run(index, launch)
        stats = dict(zip(STAT_NAMES, launch.stats))
        error = launch.error.decode(errors="replace")
        result = LaunchResult(stats, error, seconds)
        if strict and any(stats[p] for p in PROBLEMS):
            raise MslRuntimeError(f"{kernel}: {', '.join(f'{p}={stats[p]}' for p in PROBLEMS if stats[p])}\n"
                                  f"{error}")
        return result

    def _run(self, index: int, launch: _Launch) -> float:
        import time

        start = time.perf_counter()
        code = self._lib.msl_hx_run(ctypes.byref(launch), index)
        seconds = time.perf_counter() - start
        if code:
            raise MslRuntimeError(launch.error.decode(errors="replace"))
        return seconds

    def _run_guarded(self, index: int, launch: _Launch, arrays: dict[int, np.ndarray],
                     count: int) -> tuple[float, _Launch]:
        page = mmap.PAGESIZE
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        maps, views = [], {}
        lo = (ctypes.c_uint64 * max(1, count))()
        hi = (ctypes.c_uint64 * max(1, count))()
        pointers = (ctypes.c_void_p * max(1, count))()
        for n, a in arrays.items():
            nbytes = max(a.nbytes, 1)
            body = -(-nbytes // page) * page
            region = mmap.mmap(-1, body + 2 * page, flags=mmap.MAP_SHARED)
            base = ctypes.addressof(ctypes.c_char.from_buffer(region))
            libc.mprotect(base, page, 0)  # guard before
            libc.mprotect(base + page + body, page, 0)  # guard after
            # Data ends on the guard page (16-byte aligned start); slack bytes stay NaN-poisoned.
            offset = page + ((body - nbytes) & ~15)
            view = np.frombuffer(region, np.uint8, count=body, offset=page)
            view[:] = 0xFF
            data = np.frombuffer(region, np.uint8, count=a.nbytes, offset=offset)
            data[:] = a.reshape(-1).view(np.uint8)
            maps.append(region)
            views[n] = data
            pointers[n] = base + offset
            lo[n], hi[n] = base + offset, base + offset + a.nbytes
        launch.buffers, launch.num_buffers = pointers, count
        launch.guard_lo, launch.guard_hi, launch.num_guard = lo, hi, count
        shared = mmap.mmap(-1, ctypes.sizeof(_Launch), flags=mmap.MAP_SHARED)
        shared_launch = _Launch.from_buffer(shared)
        ctypes.memmove(ctypes.addressof(shared_launch), ctypes.addressof(launch), ctypes.sizeof(_Launch))
        read_fd, write_fd = os.pipe()
        import time

        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # child: run, report through the shared launch record and stderr pipe
            os.close(read_fd)
            os.dup2(write_fd, 2)
            code = self._lib.msl_hx_run(ctypes.byref(shared_launch), index)
            os._exit(3 if code else 0)
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            stderr = pipe.read()
        _, status = os.waitpid(pid, 0)
        seconds = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        result = _Launch()
        ctypes.memmove(ctypes.addressof(result), ctypes.addressof(shared_launch), ctypes.sizeof(_Launch))
        del shared_launch
        if code != 0:
            message = stderr.strip() or result.error.decode(errors="replace")
            raise MslRuntimeError(f"guarded launch failed (exit {code}): {message}")
        for n, a in arrays.items():
            if a.flags.writeable:
                a.reshape(-1).view(np.uint8)[:] = views[n]
        del views
        return seconds, result


def _indices(text: bytes | None) -> list[int]:
    return [int(x) for x in text.decode().split(",") if x] if text else []


def _dims(d) -> tuple[int, int, int]:
    d = tuple(int(x) for x in d)
    if not 1 <= len(d) <= 3 or min(d) < 1:
        raise ValueError(f"expected 1-3 positive sizes, got {d}")
    return d + (1,) * (3 - len(d))


def _as_array(b: object) -> np.ndarray:
    if isinstance(b, np.ndarray):
        if not b.flags.c_contiguous:
            raise ValueError("buffers must be C-contiguous numpy arrays")
        return b
    if isinstance(b, (np.generic, np.void)):
        return np.array([b])
    if isinstance(b, (bytes, bytearray)):
        return np.frombuffer(bytearray(b), np.uint8)
    raise TypeError(f"unsupported buffer type {type(b).__name__}")


__all__ = ["LaunchResult", "MslCompileError", "MslLibrary", "MslRuntimeError", "default_cxx"]
