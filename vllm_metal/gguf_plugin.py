"""vLLM general plugin: a local ``.gguf`` file is a valid ``--model`` (and draft model).

vLLM 0.33 has no GGUF path of its own. Before vLLM builds its ModelConfig we
write (once, cached) a directory with the config.json, generation config and
tokenizer files derived from the GGUF metadata, and point vLLM's config and
tokenizer loading at it; ``--model`` stays the GGUF file, which the worker's
loader reads with MLX.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger("vllm_metal")

_MARK = "_vllm_metal_gguf"


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_model_config
    if getattr(original, _MARK, False):
        return

    def create_model_config(self):
        redirect_gguf_args(self)
        redirect_gguf_draft(self)
        return original(self)

    setattr(create_model_config, _MARK, True)
    create_model_config.__doc__ = original.__doc__
    EngineArgs.create_model_config = create_model_config


def gguf_model_file(model: str | None) -> Path | None:
    """The GGUF file ``model`` names (a .gguf file, or a directory holding one and no
    config.json), else None."""
    if not model:
        return None
    path = Path(model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = [p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file()]
        if found:
            from vllm_metal.gguf.loader import find_gguf_file

            return find_gguf_file(path)  # refuses an ambiguous directory by name
    return None


def redirect_gguf_args(args) -> None:
    """Point an EngineArgs' config, tokenizer and generation config at the GGUF's HF files."""
    gguf = gguf_model_file(args.model)
    if gguf is None:
        return
    from vllm_metal import envs
    from vllm_metal.gguf.loader import materialize_hf_dir

    hf_dir = str(materialize_hf_dir(gguf, cache_root=envs.VLLM_METAL_GGUF_CACHE))
    original_model = args.model
    args.model = str(gguf)
    if args.tokenizer in (None, original_model, str(gguf)):
        args.tokenizer = hf_dir
    if args.hf_config_path is None:
        args.hf_config_path = hf_dir
    if getattr(args, "generation_config", "auto") == "auto":
        args.generation_config = hf_dir
    logger.info("Serving GGUF %s (config and tokenizer from its metadata, in %s)", gguf, hf_dir)


def redirect_gguf_draft(args) -> None:
    """A GGUF draft model (--speculative-config's model): vLLM builds the draft's config
    from a directory of HF files and takes no separate config path, so the draft is
    named by the file's derived directory, whose marker names the file the worker
    loads (model_lifecycle)."""
    spec = args.speculative_config
    if not isinstance(spec, dict):
        return
    gguf = gguf_model_file(spec.get("model"))
    if gguf is None:
        return
    from vllm_metal import envs
    from vllm_metal.gguf.loader import materialize_hf_dir

    hf_dir = str(materialize_hf_dir(gguf, cache_root=envs.VLLM_METAL_GGUF_CACHE))
    args.speculative_config = {**spec, "model": hf_dir}
    logger.info("Draft model GGUF %s (config from its metadata, in %s)", gguf, hf_dir)
