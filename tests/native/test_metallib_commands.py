"""The metallib build commands (csrc/cmake/metallib_commands.cmake), printed by
CMake in script mode: the AIR compile and the link both target the oldest
supported macOS from one variable, and the link runs `metal`, as MLX's does. A
metallib stamped with the build SDK's macOS does not load on older ones."""

from __future__ import annotations

import shutil
import subprocess
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
        'vllm_metal_air_command(air "k.metal" "k.air" -std=metal3.1)\n'
        'vllm_metal_link_command(link "out.metallib" a.air b.air)\n'
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
    assert "xcrun" not in build
    assert "vllm_metal_air_command(" in build and "vllm_metal_link_command(" in build
