"""The GitHub workflows: actionlint finds nothing, and they run what they promise
(the Linux job is the project's CI entry point; the macOS job proves Metal)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
ACTIONLINT = Path(sys.executable).with_name("actionlint")


def _load(name: str) -> dict:
    return yaml.safe_load((REPO / ".github" / "workflows" / name).read_text())


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_actionlint_passes():
    assert WORKFLOWS
    out = subprocess.run([str(ACTIONLINT), "-no-color", *map(str, WORKFLOWS)], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_linux_job_is_the_project_ci():
    job = _load("ci.yml")["jobs"]["linux"]
    assert "bash .ci/run" in _runs(job)
    assert job["timeout-minutes"] <= 90


def test_macos_job_installs_and_proves_the_metal_platform():
    job = _load("ci.yml")["jobs"]["macos"]
    assert job["runs-on"].startswith("macos-15")
    runs = _runs(job)
    for needed in ("./install.sh --dev", "MetalPlatform", "Metal kernels loaded",
                   "-m pytest -q", "test_smollm2_golden.py"):
        assert needed in runs, needed


def test_release_builds_a_wheel_per_platform_and_checks_the_tag():
    jobs = _load("release.yml")["jobs"]
    assert set(jobs["wheels"]["strategy"]["matrix"]["runner"]) == {
        "macos-15", "ubuntu-24.04", "ubuntu-24.04-arm"}
    runs = _runs(jobs["wheels"])
    assert "pip wheel --no-deps --no-build-isolation" in runs and "__version__" in runs


def test_homebrew_job_checks_installs_tests_and_serves_the_formula():
    job = _load("ci.yml")["jobs"]["homebrew"]
    assert job["runs-on"].startswith("macos-15")
    runs = _runs(job)
    for needed in ("brew style", "brew audit --strict", "brew install --build-from-source --HEAD",
                   "brew test",
                   "brew services start", "/v1/models"):
        assert needed in runs, needed
    # The HEAD build must be of the commit under test, not of the repository's main.
    assert 'revision: \\"$(git rev-parse HEAD)\\"' in runs
    formula = (REPO / "Formula" / "vllm-metal.rb").read_text()
    assert 'url "https://github.com/vllm-metal/vllm-metal.git", branch: "main"' in formula


def test_release_bumps_the_formula_after_publishing():
    job = _load("release.yml")["jobs"]["formula"]
    assert job["needs"] == "publish" and job["runs-on"].startswith("macos-15")
    runs = _runs(job)
    for needed in ('tools/formula_resources.py --release "$GITHUB_REF_NAME"', "brew install",
                   "brew test", "git push origin HEAD:main"):
        assert needed in runs, needed
