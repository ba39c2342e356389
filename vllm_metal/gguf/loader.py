"""Serve a `.gguf` file: find it, build its mlx-lm model, and write the HF files vLLM reads."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from vllm_metal.gguf.architectures import architecture_of
from vllm_metal.gguf.config import check_architecture, hf_config_from_gguf
from vllm_metal.gguf.header import GGUFHeader, read_header
from vllm_metal.gguf.tokenizer import tokenizer_files
from vllm_metal.gguf.weights import LAYER_PARAMETER, check_tensor_types, gguf_weights

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
                    arrange: Callable[[nn.Module], None] | None = None,
                    settle: Callable[[int, nn.Module], None] | None = None,
                    ) -> tuple[nn.Module, dict[str, Any]]:
    """(mlx-lm model, HF config dict) for a GGUF file or a directory holding one.

    Quantized tensors stay MLX-quantized (group 32; see gguf/quants.py for the mapping
    of each GGML type); floating parameters, quantization scales and biases included,
    are cast to `dtype`. ``arrange(model)`` changes the model before any tensor is
    read (a pipeline stage cuts the layers it does not hold): only the parameters it
    keeps are read, and the tensors of layers left with none are not required.
    ``settle(index, layer)`` changes each decoder layer once its tensors are in, before
    the next layer's are read (a tensor rank keeps its slices), so the whole model is
    never in memory at once.
    """
    if not isinstance(dtype, mx.Dtype) or not mx.issubdtype(dtype, mx.floating):
        raise TypeError(f"dtype must be an MLX floating dtype, got {dtype!r}")
    from mlx_lm.utils import _get_classes

    from vllm_metal.models.adapter import backbone_layers

    header = read_checked_header(find_gguf_file(path))
    config = hf_config_from_gguf(header)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))   # lazy: nothing computed yet
    unread: frozenset[int] = frozenset()
    if arrange is not None:
        before = layers_with_parameters(model)
        arrange(model)
        unread = frozenset(before - layers_with_parameters(model))
    layers = backbone_layers(model) if settle is not None else None
    for index, weights, quantization in gguf_weights(
            header, model, architecture_of(header.metadata)[1], config, unread):
        if quantization:
            nn.quantize(model, class_predicate=lambda p, _m: quantization.get(p, False))
        _check_shapes(model, weights)
        model.load_weights(list(weights.items()), strict=False)
        if index is not None and layers is not None:
            layers[index].set_dtype(dtype)
            settle(index, layers[index])
            mx.eval(layers[index].parameters())   # the layer's whole tensors go
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model, config


def _check_shapes(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Each array has the shape of the parameter it replaces (what mlx's strict
    load_weights checks; the model is loaded a layer at a time, so not strictly)."""
    current = dict(tree_flatten(model.parameters()))
    for name, array in weights.items():
        if name not in current:
            raise ValueError(f"the GGUF's tensors give {name!r}, which the model lacks")
        if current[name].shape != array.shape:
            raise ValueError(f"the GGUF's {name!r} is {tuple(array.shape)}; the model "
                             f"expects {tuple(current[name].shape)}")


def layers_with_parameters(model: nn.Module) -> set[int]:
    """Indices N of the model's `layers.N.` modules that hold a parameter."""
    return {int(m.group(1)) for name, _ in tree_flatten(model.parameters())
            if (m := LAYER_PARAMETER.search(name))}


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
