"""The metallib build commands (csrc/cmake/metallib_commands.cmake), printed by
CMake in script mode: the AIR compile and the link both target the oldest
supported macOS from one variable, and the link runs `metal`, as MLX's does. A
metallib stamped with the build SDK's macOS does not load on older ones.

And the tensor-op library's build (csrc/cmake/tensor_metallib.cmake), run with a
stand-in `xcrun` on PATH: Metal 4 for macOS 26, and a failure leaves no library
and a warning, never a failed build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CMAKE_DIR = REPO / "csrc" / "cmake"

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake (the build's own tool)")


def commands(tmp_path: Path, *defines: str) -> tuple[list[str], list[str]]:
    """(AIR compile, link) commands, as the argument lists CMake would run."""
    script = tmp_path / "print_commands.cmake"
    script.write_text(
        f'include("{(CMAKE_DIR / "metallib_commands.cmake").as_posix()}")\n'
        'vllm_metal_air_command(air "${VLLM_METAL_MACOS_MIN}" "k.metal" "k.air" -std=metal3.1)\n'
        'vllm_metal_link_command(link "${VLLM_METAL_MACOS_MIN}" "out.metallib" a.air b.air)\n'
        'message("${air}")\nmessage("${link}")\n')
    run = subprocess.run(["cmake", *[f"-D{d}" for d in defines], "-P", str(script)],
                         capture_output=True, text=True, check=True)
    air, link = run.stderr.strip().splitlines()  # message() prints to stderr
    return air.split(";"), link.split(";")


def test_both_steps_target_the_oldest_supported_macos(tmp_path):
    air, link = commands(tmp_path)
    assert "-mmacosx-version-min=14.0" in air
    assert "-mmacosx-version-min=14.0" in link


def test_one_variable_sets_both(tmp_path):
    air, link = commands(tmp_path, "VLLM_METAL_MACOS_MIN=15.0")
    def version_flags(command):
        return [arg for arg in command if "version-min" in arg]

    assert version_flags(air) == version_flags(link) == ["-mmacosx-version-min=15.0"]


def test_the_link_runs_metal(tmp_path):
    air, link = commands(tmp_path)
    assert air[:4] == link[:4] == ["xcrun", "-sdk", "macosx", "metal"]
    assert link[-4:] == ["a.air", "b.air", "-o", "out.metallib"]


def test_the_build_uses_these_commands():
    build = (CMAKE_DIR / "kernels_v2.cmake").read_text()
    tensor = (CMAKE_DIR / "tensor_metallib.cmake").read_text()
    assert "xcrun" not in build and "xcrun" not in tensor
    assert "vllm_metal_air_command(" in build and "vllm_metal_link_command(" in build
    assert "vllm_metal_air_command(" in tensor and "vllm_metal_link_command(" in tensor
    # The main library stays Metal 3.1 for macOS 14; only the tensor-op one is Metal 4.
    assert build.count("-std=metal3.1") == 1 and build.count("-std=metal4.0") == 1


# A stand-in xcrun: logs its arguments, fails when told to (FAIL_ON matches an
# argument) and otherwise writes the file after -o.
FAKE_XCRUN = """#!/usr/bin/env python3
import os, sys
with open(os.environ["XCRUN_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if any(os.environ["FAIL_ON"] in a for a in sys.argv[1:]):
    sys.exit("metal: error: unknown argument '-std=metal4.0'")
open(sys.argv[sys.argv.index("-o") + 1], "w").write("lib")
"""


def build_tensor_library(tmp_path: Path, fail_on: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    xcrun = bin_dir / "xcrun"
    xcrun.write_text(FAKE_XCRUN.replace("/usr/bin/env python3", sys.executable))
    xcrun.chmod(0o755)
    log = tmp_path / "xcrun.log"
    log.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "XCRUN_LOG": str(log), "FAIL_ON": fail_on or "no argument has this"}
    run = subprocess.run(
        ["cmake", "-DSOURCES=a.metal|b.metal", "-DFLAGS=-std=metal4.0|-fno-fast-math",
         f"-DAIR_DIR={tmp_path / 'air'}", f"-DMETALLIB={tmp_path / 't.metallib'}",
         f"-DSTAMP={tmp_path / 't.stamp'}", "-P", str(CMAKE_DIR / "tensor_metallib.cmake")],
        capture_output=True, text=True, env=env)
    return run, log.read_text().splitlines()


def test_the_tensor_library_is_metal4_for_macos_26(tmp_path):
    run, calls = build_tensor_library(tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "t.metallib").read_text() == "lib" and (tmp_path / "t.stamp").exists()
    compile_a, compile_b, link = calls
    for command in calls:
        assert command.startswith("-sdk macosx metal") and "-mmacosx-version-min=26.0" in command
    air = tmp_path / "air"
    assert "-std=metal4.0 -fno-fast-math" in compile_a
    assert compile_a.endswith(f"-c a.metal -o {air / 'a.air'}")
    assert compile_b.endswith(f"-c b.metal -o {air / 'b.air'}")
    assert link.endswith(f"{air / 'a.air'} {air / 'b.air'} -o {tmp_path / 't.metallib'}")


@pytest.mark.parametrize("fail_on, step", [("-std=metal4.0", "compiling a.metal"),
                                           ("b.air", "compiling b.metal"),
                                           ("t.metallib", "linking")])
def test_a_failed_tensor_library_warns_and_leaves_none(tmp_path, fail_on, step):
    (tmp_path / "t.metallib").write_text("an older build's")  # never left behind
    run, calls = build_tensor_library(tmp_path, fail_on)
    assert run.returncode == 0  # the build goes on: the other kernels do not need this library
    assert not (tmp_path / "t.metallib").exists() and (tmp_path / "t.stamp").exists()
    assert "no tensor-op library, so the NaxPrefill route stays off" in run.stderr
    assert step in run.stderr and "unknown argument '-std=metal4.0'" in run.stderr
    assert fail_on in calls[-1]  # it stopped at the failing step


def configure_for_apple(tmp_path: Path) -> Path:
    """The real project configured with its Apple branch on (APPLE=1): the build
    graph a Mac gets, its steps run here with the stand-in xcrun."""
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(REPO / "csrc"), "-B", str(build), "-G", "Unix Makefiles", "-DAPPLE=1",
                    f"-DPython_EXECUTABLE={sys.executable}"], capture_output=True, text=True, check=True)
    return build


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("metal4", [True, False])
def test_a_mac_build_makes_both_libraries_or_only_the_main_one(tmp_path, metal4):
    from vllm_metal.native import TENSOR_METALLIB_NAME, METALLIB_NAME, kernel_sources

    build = configure_for_apple(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "xcrun").write_text(FAKE_XCRUN.replace("/usr/bin/env python3", sys.executable))
    (bin_dir / "xcrun").chmod(0o755)
    log = tmp_path / "xcrun.log"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "XCRUN_LOG": str(log),
           "FAIL_ON": "no argument has this" if metal4 else "-std=metal4.0"}
    run = subprocess.run(["make", "-C", str(build), "vllm_metal_metallib", "vllm_metal_tensor_metallib"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr  # a toolchain without Metal 4 still builds
    assert (build / METALLIB_NAME).exists()
    assert (build / TENSOR_METALLIB_NAME).exists() == metal4
    assert ("no tensor-op library" in run.stderr) == (not metal4)
    compiles = [c.split() for c in log.read_text().splitlines() if " -c " in c]
    compiled = {Path(c[c.index("-c") + 1]).name: c for c in compiles}
    tensor_files = {p.name for p in kernel_sources.tensor_op_files(REPO / "kernels_v2")}
    assert set(compiled) == {p.name for p in (REPO / "kernels_v2").glob("*.metal")}
    for name, command in compiled.items():  # each file in one library, as its language
        tensor = name in tensor_files
        assert ("-std=metal4.0" in command, "-std=metal3.1" in command) == (tensor, not tensor)
        assert f"-mmacosx-version-min={'26.0' if tensor else '14.0'}" in command
    install = (build / "cmake_install.cmake").read_text()
    assert re.search(rf'OPTIONAL FILES "[^"]*/{TENSOR_METALLIB_NAME}"', install)  # installed if built
