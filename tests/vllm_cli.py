"""vLLM's own `vllm serve` argument parser, to check what an argv really means to it."""

from __future__ import annotations

import functools


@functools.cache
def serve_parser():
    """The parser `vllm serve` uses (it also expands a --config YAML file)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser
