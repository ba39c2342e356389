"""Install helpers: per-peer virtualenvs, pip, sdist download, CMake builds, all logged to files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

DEFAULT_CACHE_ROOT = Path("~/.cache/vllm-metal-bench")


class InstallError(RuntimeError):
    """A peer could not be installed; the message names the log holding the details."""


def run_logged(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None,
               timeout: float = 3600) -> None:
    """Run `cmd`, appending its output to `log`; raise InstallError naming the log on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            raise InstallError(f"{cmd[0]} timed out after {timeout:.0f}s; see {log}") from None
    if rc != 0:
        raise InstallError(f"`{' '.join(cmd[:4])} ...` exited with {rc}; see {log}")


def base_python() -> str:
    """The interpreter that peer venvs are made from: the one behind our own venv."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(base) if base.exists() else sys.executable


def ensure_venv(root: Path, packages: list[str], log: Path, env: dict | None = None) -> Path:
    """A venv at `root` holding `packages`; reused when its marker says the same packages.

    Returns the venv's bin directory. The marker is written last, so a failed
    install is redone on the next run instead of being reused half-built.
    """
    marker = root / ".installed"
    want = "\n".join(packages)
    if marker.exists() and marker.read_text() == want:
        return root / "bin"
    if root.exists():
        shutil.rmtree(root)
    run_logged([base_python(), "-m", "venv", str(root)], log)
    pip = [str(root / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    run_logged([*pip, "install", "-q", "--upgrade", "pip"], log)
    run_logged([*pip, "install", *packages], log, env=env)
    marker.write_text(want)
    return root / "bin"


def download_sdist(requirement: str, dest: Path, log: Path) -> Path:
    """Download the sdist of `requirement` (only that package is forced to source)."""
    name = requirement.split("=")[0].split("<")[0].split(">")[0].strip()
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob("*.tar.gz"))
    if not found:
        run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", name,
                    requirement, "-d", str(dest)], log)
        found = sorted(dest.glob("*.tar.gz"))
    if not found:
        raise InstallError(f"pip download left no sdist for {requirement} in {dest}; see {log}")
    return found[-1]


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack a .tar.gz once into `dest`; returns `dest`."""
    marker = dest / ".unpacked"
    if not marker.exists():
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
        marker.touch()
    return dest


def cmake_build(source: Path, build: Path, options: list[str], target: str, log: Path,
                jobs: int | None = None) -> None:
    """Configure `source` into `build` (Release, Ninja when present) and build `target`."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    run_logged(["cmake", "-S", str(source), "-B", str(build), *generator,
                "-DCMAKE_BUILD_TYPE=Release", *options], log)
    run_logged(["cmake", "--build", str(build), "--target", target,
                "-j", str(jobs or os.cpu_count() or 2)], log)


TOOLS_PACKAGES = ["numpy", "threadpoolctl", "gguf", "matplotlib"]


def ensure_tools_venv(cache_root: Path) -> Path:
    """The venv that measures machine limits and draws plots; returns its python."""
    bin_dir = ensure_venv(cache_root / "tools" / "venv", TOOLS_PACKAGES,
                          cache_root / "logs" / "install-tools.log")
    return bin_dir / "python"
