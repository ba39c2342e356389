"""The ``vllm-metal`` command: ``vllm-metal serve MODEL [vLLM serve flags...]``."""

from __future__ import annotations

import argparse
import os
import sys


def _serve(args: list[str]) -> int:
    if not args or args[0].startswith("-") and args[0] not in ("-h", "--help"):
        print("usage: vllm-metal serve MODEL [vllm serve options]", file=sys.stderr)
        return 2
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    command = [vllm, "serve", *args] if os.path.exists(vllm) else [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *args]
    os.execv(command[0], command)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="vllm-metal",
        description="Serve LLMs with vLLM on Apple Silicon (Metal) or on CPUs, through MLX.")
    parser.add_argument("command", choices=["serve"], help="serve: start an OpenAI-compatible server")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return _serve(rest)
    parser.error(f"unknown command {command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
