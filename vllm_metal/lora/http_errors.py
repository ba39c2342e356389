"""vLLM general plugin: a refused LoRA adapter is the client's error (HTTP 400).

vLLM 0.33's /v1/load_lora_adapter (and --lora-modules at startup) hands the adapter
to the engine and answers 500 "InternalServerError" for anything the engine raises
except a missing adapter. Our engine checks the adapter (format, rank, target
modules, sizes) and raises with a message that starts with REFUSED; this plugin
turns exactly those answers into 400s with the same message. Every other error keeps
vLLM's own status.
"""

from __future__ import annotations

from http import HTTPStatus

from vllm_metal.lora.adapter_files import REFUSED

_MARK = "_vllm_metal_lora_refusals"


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent."""
    try:
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    except ImportError:  # another vLLM layout: its own statuses stand
        return
    original = OpenAIServingModels.load_lora_adapter
    if getattr(original, _MARK, False):
        return

    async def load_lora_adapter(self, *args, **kwargs):
        return as_client_error(await original(self, *args, **kwargs))

    setattr(load_lora_adapter, _MARK, True)
    load_lora_adapter.__doc__ = original.__doc__
    OpenAIServingModels.load_lora_adapter = load_lora_adapter


def as_client_error(result):
    """RESULT, with a 500 ErrorResponse caused by a refused adapter made a 400."""
    error = getattr(result, "error", None)
    if error is None or REFUSED not in str(getattr(error, "message", "")):
        return result
    message = error.message[error.message.index(REFUSED) + len(REFUSED):]
    error.message = message
    error.type = "BadRequestError"
    error.code = HTTPStatus.BAD_REQUEST.value
    return result
