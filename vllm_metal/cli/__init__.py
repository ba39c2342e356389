"""The ``vllm-metal`` command: serve, models, doctor."""

from __future__ import annotations

import argparse
import sys

from vllm_metal.cli import doctor, models, serve

COMMANDS = {
    "serve": (serve.main, "start the OpenAI-compatible server (default: the bundled SmolLM2)"),
    "models": (models.main, "list bundled and locally cached models with their sizes"),
    "doctor": (doctor.main, "check the installation and say how to fix what is wrong"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="vllm-metal",
        description="Serve LLMs with vLLM through MLX: Metal on Apple Silicon, the CPU elsewhere.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(f"  {name:8s} {text}" for name, (_, text) in COMMANDS.items())
        + "\n\nRun 'vllm-metal COMMAND --help' for a command's options.")
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        parser.error(f"unknown command {argv[0]!r} (choose from {', '.join(COMMANDS)})")
    return COMMANDS[argv[0]][0](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
