"""`vllm-metal serve --help` names only flags and parser names vLLM really has."""

import re

from tests.vllm_cli import serve_parser
from vllm_metal.cli.serve import USAGE


def _serve_options() -> set[str]:
    parser = serve_parser()
    serve = next(a for a in parser._actions if a.dest == "subparser").choices["serve"]
    return {option for action in serve._actions for option in action.option_strings}


def test_every_flag_in_the_help_is_a_vllm_serve_option():
    flags = set(re.findall(r"(--[a-z][a-z-]+)", USAGE))
    assert {"--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser",
            "--structured-outputs-config", "--tool-strict-level"} <= flags
    assert flags - {"--config"} <= _serve_options(), flags - _serve_options()


def test_parser_names_in_the_help_are_registered():
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    for name in ("hermes", "llama3_json", "pythonic", "qwen3_xml", "mistral"):
        assert name in USAGE and ToolParserManager.get_tool_parser(name)
    for name in ("qwen3", "deepseek_r1"):
        assert name in USAGE and ReasoningParserManager.get_reasoning_parser(name)
