#!/usr/bin/env python3
"""Write a tiny random-weight HF model directory (no hub access), e.g. for a smoke run.

    python tools/make_tiny_model.py /tmp/tiny-llama --family llama
    python tools/make_tiny_model.py /tmp/tiny-q4 --family qwen3 --quantize-bits 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The builder lives with the tests; the repo root makes `tests.tiny_models` importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.tiny_models import FAMILIES, ROPE_SCALING_KINDS, make_tiny_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to create (must be absent or empty)")
    parser.add_argument("--family", choices=FAMILIES, default="llama")
    parser.add_argument("--quantize-bits", type=int, choices=(4, 8), default=None)
    parser.add_argument("--group-size", type=int, choices=(32, 64), default=64)
    parser.add_argument("--rope-scaling", choices=ROPE_SCALING_KINDS, default=None)
    parser.add_argument("--head-dim", type=int, choices=(64, 128), default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    try:
        path = make_tiny_model(
            args.out_dir,
            args.family,
            quantize_bits=args.quantize_bits,
            group_size=args.group_size,
            rope_scaling=args.rope_scaling,
            head_dim=args.head_dim,
            seed=args.seed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
