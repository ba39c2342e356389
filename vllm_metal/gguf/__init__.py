"""GGUF checkpoints as mlx-lm models, with HF config and tokenizer files.

`materialize_hf_dir` writes what vLLM reads (config, tokenizer); `load_gguf_model`
builds the MLX model the worker runs.
"""

from vllm_metal.gguf.architectures import ARCHITECTURES
from vllm_metal.gguf.config import hf_config_from_gguf
from vllm_metal.gguf.header import GGUFHeader, TensorInfo, read_header
from vllm_metal.gguf.loader import (
    DEFAULT_CACHE_ROOT,
    find_gguf_file,
    gguf_source,
    load_gguf_model,
    materialize_hf_dir,
)
from vllm_metal.gguf.quants import SUPPORTED_TYPES
from vllm_metal.gguf.tokenizer import build_tokenizer, tokenizer_files

__all__ = [
    "ARCHITECTURES", "DEFAULT_CACHE_ROOT", "GGUFHeader", "SUPPORTED_TYPES", "TensorInfo",
    "build_tokenizer", "find_gguf_file", "gguf_source", "hf_config_from_gguf",
    "load_gguf_model", "materialize_hf_dir", "read_header", "tokenizer_files",
]
