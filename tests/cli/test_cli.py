"""The vllm-metal command: default model, pass-through flags, models, doctor."""

import subprocess
import sys
from pathlib import Path

import pytest

from vllm_metal.cli import main
from vllm_metal.cli.bundled import DEFAULT_MODEL
from tests.vllm_cli import serve_parser
from vllm_metal.cli.serve import build_command

REPO = Path(__file__).resolve().parents[2]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "vllm_metal.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_serve_without_model_serves_the_bundled_gguf_under_its_name():
    argv = build_command(["--host", "127.0.0.1", "--port", "9"])
    assert argv[:2] == ["serve", str(DEFAULT_MODEL.path())]
    assert argv[argv.index("--served-model-name") + 1] == "SmolLM2-135M-Instruct"
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "9"]


def test_serve_with_a_model_passes_everything_through():
    assert build_command(["/m", "--max-model-len", "64"]) == ["serve", "/m", "--max-model-len", "64"]
    assert build_command(["--model=/m"]) == ["serve", "--model=/m"]


def test_user_served_name_is_kept():
    argv = build_command(["--served-model-name", "mine"])
    assert argv.count("--served-model-name") == 1 and "mine" in argv


def test_a_config_file_model_is_served_not_the_bundled_one(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("host: 127.0.0.1\nport: 8123\nmodel: /srv/model\n"
                      "served-model-name: mine\n")
    args = serve_parser().parse_args(build_command(["--config", str(config)]))
    assert (args.model_tag, args.model, args.port) == (None, "/srv/model", 8123)
    assert args.served_model_name == ["mine"]


def test_a_config_file_without_model_serves_the_bundled_one(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("# only where to listen\nhost: 127.0.0.1\nport: 8124\n")
    args = serve_parser().parse_args(build_command(["--config", str(config), "--port", "9"]))
    assert args.model_tag == str(DEFAULT_MODEL.path()) and args.port == 9
    assert args.served_model_name == [DEFAULT_MODEL.name]


@pytest.mark.parametrize("command", [[], ["serve"], ["models"], ["doctor"]])
def test_help(command):
    out = _cli(*command, "--help")
    assert out.returncode == 0 and "usage" in out.stdout.lower()


def test_unknown_command_is_an_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2 and "frobnicate" in capsys.readouterr().err


def test_models_lists_the_bundled_model_with_its_size():
    out = _cli("models")
    assert out.returncode == 0
    line = next(l for l in out.stdout.splitlines() if l.startswith(DEFAULT_MODEL.name))
    assert "MiB" in line and str(DEFAULT_MODEL.path()) in line


def test_doctor_reports_a_healthy_setup():
    out = _cli("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "healthy" in out.stdout and "FAIL" not in out.stdout
    for part in ("platform", "mlx", "build", "extension", "kernels", "memory", "default model"):
        assert part in out.stdout
    # This checkout is installed editable by install.sh: the doctor says so, with the
    # kernels' stamp and the MLX the extension was built against.
    build = next(line for line in out.stdout.splitlines() if "] build" in line)
    assert "built from source (editable" in build and str(REPO) in build
    extension = next(line for line in out.stdout.splitlines() if "] extension" in line)
    assert "kernels_v2 stamp" in extension and "built against mlx" in extension
    nax = next(line for line in out.stdout.splitlines() if "] nax prefill" in line)
    if sys.platform != "darwin":
        assert nax.endswith("off: the CPU backend has no tensor units")


@pytest.mark.parametrize("prefix, brew", [
    ("/opt/homebrew/Cellar/vllm-metal/0.2.0/libexec", True),
    ("/opt/homebrew/opt/vllm-metal/libexec", True),
    ("/opt/vllm-metal/.venv", False),  # a clone in /opt is install.sh's, not Homebrew's
    (str(REPO / ".venv"), False),
])
def test_doctor_tells_homebrew_users_to_reinstall_with_brew(prefix, brew):
    from vllm_metal.cli.doctor import homebrew_keg

    assert homebrew_keg(prefix) is brew
