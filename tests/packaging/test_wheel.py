"""The wheel: built from this tree, it carries the compiled extension and the kernel
sources, and installed into a fresh venv it serves the bundled model with no build
tools in reach (no compiler, no CMake on PATH: nothing may compile)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import requests

import vllm_metal
from tests.e2e.server import VllmServer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    build_dir = tmp_path_factory.mktemp("build")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out),
         "--config-settings", f"build-dir={build_dir}", str(REPO)],
        check=True, cwd=out)
    (found,) = out.glob("vllm_metal-*.whl")
    return found


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory) -> Path:
    """A new venv holding the wheel; every other package is this venv's own, linked in
    (the registry is not needed), and nothing of the source checkout."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    for entry in SITE.iterdir():
        if (entry.name.startswith(("vllm_metal", "_editable_skbc_vllm_metal"))
                or (site / entry.name).exists()):   # the new venv's own pip and setuptools
            continue
        (site / entry.name).symlink_to(entry)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                    "--no-index", "--disable-pip-version-check", "-q", str(wheel)], check=True)
    return venv


def _no_build_tools_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_METAL_", "PYTHON"))}
    env["PATH"] = str(venv / "bin")   # no c++, cmake or ninja
    return env


def test_wheel_carries_the_extension_and_kernels_and_one_version(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("vllm_metal/_ext") and n.endswith(".so") for n in names)
    assert any(n.startswith("vllm_metal/kernels_v2/") and n.endswith(".metal") for n in names)
    assert not any(n.startswith(("csrc/", "tests/")) for n in names)
    assert wheel.name.startswith(f"vllm_metal-{vllm_metal.__version__}-")


def test_wheel_venv_reports_a_wheel_build(wheel_venv, tmp_path):
    out = subprocess.run([str(wheel_venv / "bin" / "vllm-metal"), "doctor"], cwd=tmp_path,
                         env=_no_build_tools_env(wheel_venv), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    build = next(line for line in out.stdout.splitlines() if "] build" in line)
    assert f"vllm-metal {vllm_metal.__version__} from a wheel" in build
    assert str(wheel_venv) in subprocess.run(
        [str(wheel_venv / "bin" / "python"), "-c", "import vllm_metal._ext as e; print(e.__file__)"],
        cwd=tmp_path, env=_no_build_tools_env(wheel_venv), capture_output=True, text=True,
        check=True).stdout


def test_wheel_venv_serves_the_bundled_model(wheel_venv, tmp_path):
    server = VllmServer(None, "--max-model-len", "512", timeout=600,
                        command=[str(wheel_venv / "bin" / "vllm-metal"), "serve"],
                        env=_no_build_tools_env(wheel_venv), cwd=str(tmp_path))
    try:
        reply = requests.post(server.base_url + "/v1/completions", json={
            "model": "SmolLM2-135M-Instruct", "prompt": "The capital of France is",
            "max_tokens": 8, "temperature": 0}, timeout=120)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["text"].strip() and reply.json()["usage"]["completion_tokens"] == 8
        assert "Native paged-attention CPU kernels loaded" in server.output() or sys.platform == "darwin"
    finally:
        server.stop()
