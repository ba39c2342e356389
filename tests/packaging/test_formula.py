"""Formula/vllm-metal.rb: Ruby syntax, Homebrew's conventions, and agreement with the
project (version, repository, Python, minimum macOS, every pin), checked without a
Mac; its install, service and test blocks run against stand-ins of Homebrew's calls
(formula_harness.rb); tools/formula_resources.py's choices of wheel checked on a
fake index."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

import vllm_metal
from tests.vllm_cli import serve_parser
from vllm_metal.cli.bundled import DEFAULT_MODEL
from vllm_metal.cli.serve import build_command

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import formula_resources as fr  # noqa: E402

FORMULA = (REPO / "Formula" / "vllm-metal.rb").read_text()
HARNESS = Path(__file__).with_name("formula_harness.rb")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RELEASE = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
TARGET = fr.Target.of_formula(FORMULA)
RESOURCE = re.compile(r'^  resource "([^"]+)" do\n    url "([^"]+)"\n    sha256 "([0-9a-f]{64})"\n'
                      r"  end\n", re.M)

# Homebrew's order of a formula's parts (its ComponentsOrder audit), for the parts a
# formula like this one uses; `service` has no place in it.
ORDER = ["include", "desc", "homepage", "url", "mirror", "version", "sha256", "license",
         "revision", "head", "livecheck", "bottle", "keg_only", "depends_on",
         "uses_from_macos", "conflicts_with", "preserve_rpath", "skip_clean", "resource",
         "patch", "def install", "def post_install", "def caveats", "test"]


def _ruby() -> str:
    ruby = shutil.which("ruby")
    if ruby is None:
        if os.environ.get("CI"):
            pytest.fail("ruby is missing (.ci/run installs Debian's ruby)")
        pytest.skip("ruby is not installed (apt-get install ruby)")
    return ruby


def ruby_check(text: str, tmp_path: Path) -> None:
    ruby = _ruby()
    path = tmp_path / "vllm-metal.rb"
    path.write_text(text)
    out = subprocess.run([ruby, "-c", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and "Syntax OK" in out.stdout, out.stdout + out.stderr


def components(text: str) -> list[str]:
    """The formula class's top-level parts, in order (a block's `head`, `def install`...)."""
    body = text.split("class VllmMetal < Formula\n", 1)[1]
    found = []
    for line in body.splitlines():
        m = re.match(r"  (def \w+|\w+!?)", line)
        if m and not line.startswith("   "):
            found.append(m.group(1))
    return found


def resources(text: str) -> dict[str, tuple[str, str]]:
    found = {name: (url, sha) for name, url, sha in RESOURCE.findall(text)}
    assert len(found) == text.count('  resource "'), "a resource stanza has an unexpected shape"
    return found


def resource_version(url: str) -> Version:
    name = url.rsplit("/", 1)[1]
    if name.endswith(".whl"):
        return parse_wheel_filename(name)[1]
    return parse_sdist_filename(name)[1]


def check_formula(text: str) -> None:
    """Everything Homebrew's audit and this project's pins require of a formula text."""
    parts = [p for p in components(text) if p not in ("service", "end")]
    ranks = [ORDER.index(p) for p in parts]
    assert ranks == sorted(ranks), f"parts out of Homebrew's order: {parts}"
    desc = re.search(r'^  desc "([^"]+)"', text, re.M).group(1)
    assert len(desc) <= 80 and not desc.endswith(".") and not re.match(r"(?i)(a|an|the|vllm-metal)\b", desc)

    repo = PYPROJECT["project"]["urls"]["Repository"]
    assert re.search(rf'^  homepage "{re.escape(repo)}"$', text, re.M)
    assert re.search(rf'^    url "{re.escape(repo)}\.git", branch: "main"$', text, re.M)

    stable = re.search(r'^  url "([^"]+)", using: :nounzip\n  version "([^"]+)"\n'
                       r'  sha256 "([0-9a-f]{64})"$', text, re.M)
    if stable:  # after a release: the macOS wheel of this very version
        assert stable.group(2) == vllm_metal.__version__
        assert stable.group(1) == fr.release_wheel_url(repo, vllm_metal.__version__, TARGET)
    else:  # before the first release, the formula builds the source tree
        assert "head do" in text and not re.search(r'^  (url|sha256|version) ', text, re.M)


def test_ruby_parses_the_formula(tmp_path):
    ruby_check(FORMULA, tmp_path)


def test_formula_follows_homebrew_and_the_project():
    check_formula(FORMULA)


def test_python_is_the_one_the_release_wheel_is_built_for():
    py = f"{TARGET.python[0]}.{TARGET.python[1]}"
    setup = next(s for s in RELEASE["jobs"]["wheels"]["steps"]
                 if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["python-version"] == py
    assert Version(py + ".0") in Requirement("x" + PYPROJECT["project"]["requires-python"]).specifier
    # The venv's site-packages the cleaner must skip, and the interpreter of the venv.
    assert f'skip_clean "libexec/lib/python{py}/site-packages"' in FORMULA
    assert f'virtualenv_create(libexec, "python{py}"' in FORMULA


def test_minimum_macos_is_the_same_everywhere():
    """The formula's, the release wheel's, the metallib's and install.sh's."""
    want = "{}.{}".format(*TARGET.macos)
    assert RELEASE["jobs"]["wheels"]["env"]["MACOSX_DEPLOYMENT_TARGET"] == want
    cmake = (REPO / "csrc" / "cmake" / "metallib_commands.cmake").read_text()
    assert re.search(r'set\(VLLM_METAL_MACOS_MIN "([\d.]+)"', cmake).group(1) == want
    script = (REPO / "install.sh").read_text()
    assert re.search(r'version_at_least "\$macos" ([\d.]+)', script).group(1) == want
    assert set(re.findall(r"-mmacosx-version-min=([\d.]+)", script)) == {want}


def test_every_resource_is_a_target_wheel_named_as_homebrew_audits_it():
    accepted = set(TARGET.wheel_tags())
    for name, (url, _) in resources(FORMULA).items():
        assert url.startswith("https://files.pythonhosted.org/packages/"), url
        file = url.rsplit("/", 1)[1]
        if file.endswith(".whl"):
            dist, _, _, tags = parse_wheel_filename(file)
            assert tags & accepted, f"{file} does not install on {TARGET}"
        else:
            assert name == "vllm", f"only vLLM is built from its sdist, not {file}"
            dist = parse_sdist_filename(file)[0]
        assert name == canonicalize_name(dist), (name, file)


def test_resources_carry_install_sh_pins_and_satisfy_pyproject():
    found = {name: resource_version(url) for name, (url, _) in resources(FORMULA).items()}
    for name, version in fr.install_sh_pins((REPO / "install.sh").read_text()).items():
        assert found.get(name) == Version(version), f"{name}: install.sh pins {version}"
    macos = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64",
             "python_version": f"{TARGET.python[0]}.{TARGET.python[1]}"}
    for spec in fr.project_requirements((REPO / "pyproject.toml").read_text()):
        req = Requirement(spec)
        if req.marker and not req.marker.evaluate(macos):
            continue
        name = canonicalize_name(req.name)
        assert name in found and found[name] in req.specifier, f"{spec} vs {found.get(name)}"


def test_vllm_is_built_as_install_sh_builds_it_on_macos():
    """Both open vLLM's macOS override for the kernel-less 'empty' target, alike."""
    script = (REPO / "install.sh").read_text()
    for var in ("VLLM_MACOS_OVERRIDE", "VLLM_MACOS_EMPTY"):
        line = re.search(rf"^{var}='(.+)'$", script, re.M).group(1)
        assert f"'{line}'" in FORMULA, var
    assert 'with_env(VLLM_TARGET_DEVICE: "empty"' in FORMULA


def run_formula(text: str, mode: str, tmp_path: Path) -> dict:
    """FORMULA's install, post_install, service and test blocks, run by
    formula_harness.rb against stand-ins of Homebrew's calls (pip is recorded)."""
    ruby = _ruby()
    path, work = tmp_path / "vllm-metal.rb", tmp_path / "work"
    path.write_text(text)
    work.mkdir()
    out = subprocess.run([ruby, str(HARNESS), str(path), str(work), mode], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)
    run["work"] = work
    return run


def _pip_installs(run: dict) -> list[tuple[list[str], str, str | None]]:
    python = "/opt/homebrew/opt/python@3.12/bin/python3.12"
    venv_python = f"--python={run['work']}/Cellar/vllm-metal/1.0/libexec/bin/python"
    calls = [e for e in run["events"] if e[0] == "system"]
    for _, argv, _, _ in calls:
        assert argv[:5] == [python, "-m", "pip", venv_python, "install"], argv
        assert {"--no-deps", "--no-index"} <= set(argv), argv
    return [(argv[5:], cwd, target) for _, argv, cwd, target in calls]


def test_formula_runs_head_install_service_and_test(tmp_path):
    run = run_formula(FORMULA, "head", tmp_path)
    work = run["work"]
    assert ["virtualenv_create", f"{work}/Cellar/vllm-metal/1.0/libexec", "python3.12",
            False] in run["events"]
    wheels, vllm, project = _pip_installs(run)
    # Every wheel resource, staged under the name it was published as.
    published = sorted(url.rsplit("/", 1)[1] for name, (url, _) in resources(FORMULA).items()
                       if name != "vllm")
    assert run["wheels"] == published
    assert sorted(Path(a).name for a in wheels[0] if a.endswith(".whl")) == published
    # vLLM from its sdist as 'empty', the macOS override opened first.
    assert vllm[0][-2:] == ["--no-build-isolation", "."] and vllm[2] == "empty"
    assert vllm[1] == f"{work}/stage/vllm"
    assert 'VLLM_TARGET_DEVICE not in ("cpu", "empty")' in run["setup_py"]
    # HEAD: this tree, compiled.
    assert project[0][-2:] == ["--no-build-isolation", f"{work}/buildpath"] and project[2] is None
    assert run["links"] == ["vllm", "vllm-metal"]
    # The service serves the config post_install wrote, and restarts on failure.
    config = f"{work}/etc/vllm-metal/serve.yaml"
    assert ["run", [f"{work}/opt/vllm-metal/bin/vllm-metal", "serve", "--config", config],
            {}] in run["service"]
    assert ["keep_alive", {"successful_exit": "false"}] in run["service"]
    assert ["log_path", f"{work}/var/log/vllm-metal.log", {}] in run["service"]
    args = serve_parser().parse_args(build_command(["--config", config]))
    assert args.model_tag == str(DEFAULT_MODEL.path())
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    assert config in run["caveats"]
    # The test block: the doctor, then a chat answer from the served bundled model.
    shell = [e[1] for e in run["events"] if e[0] == "shell_output"]
    assert shell[0].endswith("/bin/vllm-metal doctor") and "/v1/chat/completions" in shell[1]


def test_released_formula_installs_its_wheel(tmp_path):
    repo = PYPROJECT["project"]["urls"]["Repository"]
    url = fr.release_wheel_url(repo, vllm_metal.__version__, TARGET)
    run = run_formula(fr.with_release(FORMULA, vllm_metal.__version__, url, "0" * 64),
                      "stable", tmp_path)
    *_, project = _pip_installs(run)
    assert project[0][-1] == f"{run['work']}/buildpath/{url.rsplit('/', 1)[1]}"


def test_a_release_bump_gives_a_valid_formula(tmp_path):
    repo = PYPROJECT["project"]["urls"]["Repository"]
    url = fr.release_wheel_url(repo, vllm_metal.__version__, TARGET)
    assert url.endswith(f"/releases/download/v{vllm_metal.__version__}/vllm_metal-"
                        f"{vllm_metal.__version__}-cp312-cp312-macosx_14_0_arm64.whl")
    bumped = fr.with_release(FORMULA, vllm_metal.__version__, url, "0" * 64)
    check_formula(bumped)
    ruby_check(bumped, tmp_path)
    # A second bump replaces the stable spec instead of adding one.
    again = fr.with_release(bumped, vllm_metal.__version__, url, "1" * 64)
    assert len(re.findall(r'^  sha256 ', again, re.M)) == 1 and '"' + "1" * 64 + '"' in again
    assert fr.with_resources(again, []).count('  resource "') == 0


# ---- the tool's choices, on a fake index -------------------------------------------


def _file(name: str, yanked: bool = False) -> dict:
    return {"filename": name, "url": f"https://files.example/{name}",
            "hashes": {"sha256": hashlib.sha256(name.encode()).hexdigest()}, "yanked": yanked}


def test_pick_prefers_the_targets_own_wheel():
    files = [_file("pkg-1.0-cp312-cp312-macosx_11_0_arm64.whl"),
             _file("pkg-1.0-cp312-cp312-macosx_14_0_arm64.whl"),
             _file("pkg-1.0-cp312-cp312-macosx_10_13_universal2.whl"),
             _file("pkg-1.0-cp313-cp313-macosx_14_0_arm64.whl"),
             _file("pkg-1.0-py3-none-any.whl"),
             _file("pkg-1.0.tar.gz"), _file("pkg-1.1-cp312-cp312-macosx_14_0_arm64.whl")]
    assert fr.pick(files, "pkg", "1.0", TARGET).url.endswith("pkg-1.0-cp312-cp312-macosx_14_0_arm64.whl")
    assert fr.pick(files, "PKG", "1.0", TARGET, sdist=True).url.endswith("pkg-1.0.tar.gz")


def test_pick_refuses_what_does_not_install_on_the_target():
    files = [_file("pkg-1.0-cp312-cp312-macosx_15_0_arm64.whl"),  # newer than the minimum macOS
             _file("pkg-1.0-cp312-cp312-macosx_14_0_x86_64.whl"),
             _file("pkg-1.0-cp312-cp312-manylinux_2_28_aarch64.whl"),
             _file("pkg-1.0-cp312-cp312-macosx_14_0_arm64.whl", yanked=True),
             _file("pkg-0.18-py36+-none-any.whl")]  # a name no tool parses any more
    with pytest.raises(SystemExit, match=r"pkg==1.0 has no wheel for CPython 3.12 on macOS 14.0 arm64"):
        fr.pick(files, "pkg", "1.0", TARGET)
    assert fr.pick(files + [_file("pkg-1.0-py3-none-any.whl")], "pkg", "1.0", TARGET).url.endswith(
        "py3-none-any.whl")


def test_vllm_requirements_come_from_its_sdist_without_torch_or_cmake():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in {
            "requirements/common.txt": "# comment\nregex\n-r other.txt\nfastapi[standard] >= 0.1 # why\n",
            "pyproject.toml": '[build-system]\nrequires = ["cmake>=3", "setuptools<81", '
                              '"torch == 2.14.0", "wheel"]\n'}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-9.9.9/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert fr.vllm_requirements(buf.getvalue(), "9.9.9") == [
        "regex", "fastapi[standard] >= 0.1", "setuptools<81", "wheel"]


def test_generated_block_is_replaced_whole():
    one = [fr.Resource("a", "https://x/a-1-py3-none-any.whl", "0" * 64)]
    text = fr.with_resources(FORMULA, one)
    assert resources(text) == {"a": ("https://x/a-1-py3-none-any.whl", "0" * 64)}
    assert fr.with_resources(text, one) == text
