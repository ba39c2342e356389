"""Per-request structured-output options vLLM 0.33 accepts and then drops: refused.

A request's ``structured_outputs`` may carry ``disable_any_whitespace``,
``disable_additional_properties`` and ``whitespace_pattern``, but vLLM 0.33's
grammar backends read the first two from the server's ``--structured-outputs-config``
only and the third nowhere, so such a request got HTTP 200 and an answer made
without them. (xgrammar, the usual backend, compiles schemas in strict mode, which
already keeps out properties a schema does not name: that case of
``disable_additional_properties`` is honoured and passes.) Until vLLM reads them per request, a request asking for more than the
server is configured for is refused (HTTP 400) with the setting that would honour it.
Remove this module when vLLM's backends read the request's own options.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from vllm.exceptions import VLLMValidationError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# This process's --structured-outputs-config (the platform records it when vLLM builds
# the engine config, before any request): None until then, read as vLLM's defaults.
_server_config: Any = None


class DroppedOptionError(VLLMValidationError, ValueError):
    """A request option vLLM would silently ignore (HTTP 400)."""


def remember_server_config(vllm_config: VllmConfig) -> None:
    global _server_config
    _server_config = getattr(vllm_config, "structured_outputs_config", None)


def _server(option: str) -> bool:
    return bool(getattr(_server_config, option, False))


def _refuse(option: str, message: str) -> None:
    raise DroppedOptionError(f"vllm-metal: structured_outputs.{option} {message}",
                             parameter=f"structured_outputs.{option}")


def check_structured_output_options(params: Any) -> None:
    """Raise DroppedOptionError for an option of ``params.structured_outputs`` (a
    SamplingParams') that vLLM would not apply; let everything else through."""
    options = getattr(params, "structured_outputs", None)
    if options is None:
        return
    if options.whitespace_pattern is not None:
        _refuse("whitespace_pattern",
                "is not read by any structured-output backend of vLLM 0.33; remove it "
                "(the server-wide disable_any_whitespace of --structured-outputs-config "
                "allows no whitespace at all)")
    if options.disable_any_whitespace and not _server("disable_any_whitespace"):
        _refuse("disable_any_whitespace",
                "is read by vLLM 0.33 from the server's settings only; start the server "
                "with --structured-outputs-config "
                "'{\"backend\": \"xgrammar\", \"disable_any_whitespace\": true}' "
                "or remove it from the request")
    if (options.disable_additional_properties and not _server("disable_additional_properties")
            and not _held_by_xgrammar(options)):
        _refuse("disable_additional_properties",
                "is read by vLLM 0.33 from the server's settings only; put "
                "\"additionalProperties\": false in the schema, or start the server with "
                "--structured-outputs-config "
                "'{\"backend\": \"guidance\", \"disable_additional_properties\": true}'")


def _held_by_xgrammar(options: Any) -> bool:
    """xgrammar compiles JSON schemas in strict mode: properties a schema does not name
    are already excluded, unless it allows them with additionalProperties."""
    if getattr(options, "_backend", None) != "xgrammar" or options.json is None:
        return False
    schema = options.json
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return False
    return not _allows_additional(schema)


def _allows_additional(node: Any) -> bool:
    if isinstance(node, dict):
        extra = node.get("additionalProperties")
        if extra is True or isinstance(extra, dict):
            return True
        return any(_allows_additional(v) for v in node.values())
    if isinstance(node, list):
        return any(_allows_additional(v) for v in node)
    return False
