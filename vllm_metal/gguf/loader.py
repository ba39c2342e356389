"""Serve a `.gguf` file: find it, build its mlx-lm model, and write the HF files vLLM reads."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.gguf.architectures import architecture_of
from vllm_metal.gguf.config import check_architecture, hf_config_from_gguf
from vllm_metal.gguf.header import GGUFHeader, read_header
from vllm_metal.gguf.tokenizer import tokenizer_files
from vllm_metal.gguf.weights import check_tensor_types, gguf_weights

DEFAULT_CACHE_ROOT = Path("~/.cache/vllm-metal/gguf")
# Bump when the files written for a GGUF change, so stale cache entries are not reused.
_CACHE_FORMAT = 1
SOURCE_FILE = "gguf_source.json"
_WRITTEN = ("config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", SOURCE_FILE)


def find_gguf_file(path: str | os.PathLike) -> Path:
    """`path` if it is a .gguf file, or the single .gguf file inside directory `path`."""
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"path {str(p)!r} is not a .gguf file")
        return p
    if p.is_dir():
        found = sorted(c for c in p.iterdir() if c.suffix.lower() == ".gguf" and c.is_file())
        if len(found) == 1:
            return found[0]
        if not found:
            raise ValueError(f"directory {str(p)!r} holds no .gguf file")
        raise ValueError(
            f"directory {str(p)!r} holds {len(found)} .gguf files "
            f"({', '.join(c.name for c in found)}); pass the one to serve")
    raise ValueError(f"path {str(p)!r} does not exist")


def load_gguf_model(path: str | os.PathLike, dtype: mx.Dtype = mx.float32,
                    ) -> tuple[nn.Module, dict[str, Any]]:
    """(mlx-lm model, HF config dict) for a GGUF file or a directory holding one.

    Quantized tensors stay MLX-quantized (group 32; see gguf/quants.py for the mapping
    of each GGML type); floating parameters, quantization scales and biases included,
    are cast to `dtype`.
    """
    if not isinstance(dtype, mx.Dtype) or not mx.issubdtype(dtype, mx.floating):
        raise TypeError(f"dtype must be an MLX floating dtype, got {dtype!r}")
    from mlx_lm.utils import _get_classes

    header = read_checked_header(find_gguf_file(path))
    config = hf_config_from_gguf(header)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights, quantization = gguf_weights(
        header, model, architecture_of(header.metadata)[1], config)
    if quantization:
        nn.quantize(model, class_predicate=lambda p, _m: quantization.get(p, False))
    model.load_weights(list(weights.items()), strict=True)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model, config


def read_checked_header(path: str | os.PathLike) -> GGUFHeader:
    """The file's header, refused now (before any weight is read) if the architecture,
    a tensor type or the file's layout cannot be served."""
    header = read_header(path)
    check_architecture(header.metadata)
    check_tensor_types(header)
    if int(header.metadata.get("split.count", 1)) > 1:
        raise ValueError(
            f"{header.path!r} is one shard of a split GGUF; merge the shards first "
            "(`llama-gguf-split --merge first-shard.gguf merged.gguf`)")
    return header


def materialize_hf_dir(gguf_path: str | os.PathLike,
                       cache_root: str | os.PathLike | None = None) -> Path:
    """A directory with config.json, generation_config.json and tokenizer files for the GGUF.

    Keyed by the file's absolute path, size and mtime under `cache_root` (default
    ~/.cache/vllm-metal/gguf); built in a temp dir and renamed into place, so concurrent
    callers and crashes never leave a half-written directory behind.
    """
    source = find_gguf_file(gguf_path).resolve()
    stat = source.stat()
    key = hashlib.sha256(
        f"{source}\0{stat.st_size}\0{stat.st_mtime_ns}\0{_CACHE_FORMAT}".encode()).hexdigest()
    root = Path(cache_root if cache_root is not None else DEFAULT_CACHE_ROOT).expanduser()
    target = root / f"{source.stem}-{key[:16]}"
    if _complete(target):
        return target

    header = read_checked_header(source)  # refuse now, not later in a worker
    files: dict[str, Any] = {
        "config.json": hf_config_from_gguf(header),
        **tokenizer_files(header.metadata),
        SOURCE_FILE: {"gguf_file": str(source), "size": stat.st_size,
                      "mtime_ns": stat.st_mtime_ns},
    }
    files["generation_config.json"] = _generation_config(header.metadata)

    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        for name, content in files.items():
            text = content if isinstance(content, str) else json.dumps(content, indent=2)
            (staging / name).write_text(text + "\n", encoding="utf-8")
        if target.exists() and not _complete(target):  # a damaged leftover: replace it
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(staging, target)
        except OSError:
            if not _complete(target):
                raise
            # Another process published the same directory first.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def gguf_source(hf_dir: str | os.PathLike) -> Path | None:
    """The GGUF file a `materialize_hf_dir` directory was built from (None if not one)."""
    marker = Path(hf_dir) / SOURCE_FILE
    if not marker.is_file():
        return None
    return Path(json.loads(marker.read_text(encoding="utf-8"))["gguf_file"])


def _complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in _WRITTEN)


def _generation_config(metadata: dict[str, Any]) -> dict[str, Any]:
    ids = {name: metadata.get(f"tokenizer.ggml.{name}_token_id")
           for name in ("bos", "eos", "eot", "eom", "padding")}
    stops = list(dict.fromkeys(i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None))
    config: dict[str, Any] = {}
    if ids["bos"] is not None:
        config["bos_token_id"] = ids["bos"]
    if stops:
        config["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    if ids["padding"] is not None:
        config["pad_token_id"] = ids["padding"]
    return config
