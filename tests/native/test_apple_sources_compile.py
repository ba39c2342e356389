"""The Apple-only C++ type-checks on Linux: every translation unit with an Apple
code path (the Metal eval_gpu bodies, the IORegistry probe) is compiled with
-fsyntax-only, its Apple branches selected, against the installed MLX wheel's
real Metal backend headers and our stand-in Apple declarations
(apple_stand_in/). A wrong call into MLX's Metal API fails here instead of on
the first Mac; docs/kernels.md says what this cannot catch."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from multiprocessing.pool import ThreadPool
from pathlib import Path

import mlx
import nanobind
import pytest

from vllm_metal.native import constants

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="the macOS build compiles these sources for real")

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
STAND_IN = Path(__file__).with_name("apple_stand_in")
MLX_INCLUDE = Path(mlx.__path__[0]) / "include"
# g++ is always there (it builds the extension); clang++ (Apple's compiler family) when
# installed, run with the slow tests (.ci/run runs those too).
COMPILERS = ["g++"] + ([pytest.param("clang++", marks=pytest.mark.slow)]
                       if shutil.which("clang++") else [])
METAL_SOURCE = CSRC / "metal" / "paged_attention_metal.cpp"
LAUNCHES_SOURCE = CSRC / "metal" / "launches.cpp"


def cmake_text() -> str:
    return "\n".join(p.read_text() for p in [CSRC / "CMakeLists.txt", *sorted((CSRC / "cmake").glob("*.cmake"))])


def cxx_standard() -> str:
    return re.search(r"set\(CMAKE_CXX_STANDARD (\d+)\)", cmake_text()).group(1)


def apple_only_sources() -> set[Path]:
    """Sources CMake adds on Apple only (target_sources in an if(APPLE) block)."""
    names = re.findall(r"target_sources\(\s*_ext\s+PRIVATE\s+([^)]*)\)", cmake_text())
    return {CSRC / name for group in names for name in group.split()}


def apple_sources() -> list[Path]:
    tested = {p for p in CSRC.rglob("*.cpp") if "VLLM_METAL_APPLE()" in p.read_text()}
    return sorted(tested | apple_only_sources())


def compile_command(compiler: str, source: Path) -> list[str]:
    """The build's flags (csrc/CMakeLists.txt) with the Apple paths selected."""
    return [
        compiler, "-fsyntax-only", f"-std=c++{cxx_standard()}",
        "-DVLLM_METAL_APPLE_SYNTAX_CHECK", "-DNB_DOMAIN=mlx",
        f"-DVLLM_METAL_PARTITION_SIZE={constants.PARTITION_SIZE}",
        "-DVLLM_METAL_KERNEL_BLOCK_SIZES=" + ",".join(map(str, constants.KERNEL_BLOCK_SIZES)),
        '-DVLLM_METAL_KERNELS_HASH="syntax-check"',
        f"-I{CSRC}", f"-I{REPO / 'kernels_v2'}", f"-I{sysconfig.get_paths()['include']}",
        f"-I{nanobind.include_dir()}",
        # System headers on a Mac, so system headers here too.
        "-isystem", str(STAND_IN), "-isystem", str(MLX_INCLUDE),
        str(source),
    ]


def compile_all(compiler: str, sources: list[Path]) -> list[subprocess.CompletedProcess]:
    def run(source):
        return subprocess.run(compile_command(compiler, source), capture_output=True, text=True)

    with ThreadPool(2) as pool:
        return pool.map(run, sources)


def test_the_mlx_wheel_ships_the_metal_backend_headers():
    # The premise of the check: without them it would compile against nothing real.
    device_h = MLX_INCLUDE / "mlx" / "backend" / "metal" / "device.h"
    assert "#include <Metal/Metal.hpp>" in device_h.read_text()


def test_the_apple_sources_are_found():
    names = {p.relative_to(CSRC).as_posix() for p in apple_sources()}
    assert names >= {"metal/paged_attention_metal.cpp", "ops/paged_attention.cpp",
                     "ops/reshape_and_cache.cpp", "dispatch/dispatch_env.cpp", "metal/nax_readiness.cpp"}


def test_apple_code_is_selected_only_through_platform_h():
    # A bare __APPLE__ test would be a branch this check never compiles.
    offenders = [p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*") if p.suffix in {".h", ".cpp", ".inc"}
                 and p.name != "platform.h" and "__APPLE__" in p.read_text()]
    assert offenders == []


def test_every_source_is_in_the_build():
    # So an Apple-only source added some other way cannot escape apple_only_sources().
    listed = set(re.findall(r"[\w/]+\.cpp", cmake_text()))
    sources = {p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*.cpp")}
    assert sources <= listed


@pytest.mark.parametrize("compiler", COMPILERS)
def test_apple_sources_compile(compiler, tmp_path):
    # Also every Metal backend header of MLX on its own: the stand-ins cover all
    # of them, so using one more of them in csrc/ cannot fail for want of a stand-in.
    headers = tmp_path / "mlx_metal_headers.cpp"
    headers.write_text("".join(f'#include "mlx/backend/metal/{name}"\n' for name in
                               ["device.h", "allocator.h", "event.h", "resident.h", "utils.h", "metal.h"]))
    sources = [*apple_sources(), headers]
    failures = [f"{s}:\n{r.stderr}" for s, r in zip(sources, compile_all(compiler, sources)) if r.returncode]
    assert not failures, "\n".join(failures)


# (what the mistake is, the file, the source text, its wrong replacement, text of the
# line the error is reported at)
MISTAKES = [
    ("a missing argument to an MLX encoder method", METAL_SOURCE,
     "enc.set_bytes(plan.params, 10);", "enc.set_bytes(plan.params);", "enc.set_bytes(plan.params)"),
    ("a wrong argument type (Device for Stream)", METAL_SOURCE,
     "auto& enc = mx::metal::get_command_encoder(stream);",
     "auto& enc = mx::metal::get_command_encoder(stream.device);", "get_command_encoder(stream.device)"),
    ("swapped arguments of Device::get_kernel", LAUNCHES_SOURCE,
     "hash, constants);", "constants, hash);", "constants, hash);"),
    ("a missing include", LAUNCHES_SOURCE, '#include "metal/launches.h"\n', "",
     "namespace mx = mlx::core;"),
    ("a Metal name the API does not have", LAUNCHES_SOURCE, "MTL::DataType::DataTypeBool",
     "MTL::DataType::Bool", "MTL::DataType::Bool"),
]


def test_a_wrong_call_into_the_metal_api_fails(tmp_path):
    cases = [("the unchanged source", source, "", "", None) for source in (METAL_SOURCE, LAUNCHES_SOURCE)]
    cases += MISTAKES
    copies = []
    for i, (_, source, old, new, _) in enumerate(cases):
        text = source.read_text()
        assert old in text, f"{old!r} is no longer in {source.name}: update MISTAKES"
        copy = tmp_path / f"mistake{i}.cpp"
        copy.write_text(text.replace(old, new, 1) if old else text)
        copies.append(copy)
    results = compile_all("g++", copies)
    for result in results[:2]:  # the copies compile where the originals do
        assert result.returncode == 0, result.stderr
    for (what, _, _, _, at), copy, result in zip(cases[2:], copies[2:], results[2:]):
        line = next(n for n, text in enumerate(copy.read_text().splitlines(), 1) if at in text)
        assert result.returncode != 0, f"{what} compiled"
        assert f"{copy.name}:{line}:" in result.stderr, f"{what}: no error at line {line}:\n{result.stderr}"
