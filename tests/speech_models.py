"""Tiny random-weight Whisper checkpoints, built with transformers.

`make_whisper_model(path)` instantiates transformers' ``WhisperForConditionalGeneration``
from a small config (two encoder and two decoder layers, head size 64, a 64-row
encoder over 128 mel frames), refills its parameters with seeded values scaled for
wide greedy margins, and saves it with ``save_pretrained``. transformers' own
forward of the saved checkpoint is the reference the tests compare with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.tiny_models import _damped_ids, _train_tokenizer, _write_json, cached_build

# Clips of 2 seconds by default: 200 mel frames (hop 160 at 16 kHz), 100 encoder rows.
CLIP_SECONDS = 2
WHISPER = dict(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
               decoder_attention_heads=2, encoder_ffn_dim=256, decoder_ffn_dim=256,
               num_mel_bins=80, max_target_positions=64)
BPE_VOCAB = 512
# Whisper's special tokens (its languages as vLLM lists them; then the clip's
# timestamps), after the byte-level BPE.
_LANGUAGES = ("af ar az be bg bs ca cs cy da de el en es et fa fi fr gl he hi hr hu hy id "
              "is it ja kk kn ko lt lv mi mk mr ms ne nl no pl pt ro ru sk sl sr sv sw ta "
              "th tl tr uk ur vi zh").split()
SPECIAL = (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{c}|>" for c in _LANGUAGES]
           + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
              "<|nospeech|>", "<|notimestamps|>"])


def make_whisper_model(path: str | Path, *, seed: int = 0, clip_seconds: int = CLIP_SECONDS,
                       **overrides: Any) -> Path:
    """Write a Whisper checkpoint at ``path`` (tiny unless ``overrides`` say otherwise;
    a vocab_size larger than the tokenizer's pads the table) for clips of
    ``clip_seconds``; returns it."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    path = Path(path)
    tokenizer = _train_tokenizer(BPE_VOCAB)
    stamps = [f"<|{i * 0.02:.2f}|>" for i in range(50 * clip_seconds + 1)]
    tokenizer.add_special_tokens(SPECIAL + stamps)
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    vocab = max(overrides.pop("vocab_size", 0), tokenizer.get_vocab_size())
    config = WhisperConfig(**{**WHISPER, "max_source_positions": 50 * clip_seconds,
                              **overrides}, vocab_size=vocab, decoder_start_token_id=sot,
                           pad_token_id=eot, bos_token_id=eot, eos_token_id=eot)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    rng = np.random.default_rng(seed)
    # Never sampling bytes that are not printable ASCII keeps the text valid UTF-8
    # (the head is the embedding: small rows, small logits). Whisper's own special
    # tokens keep their rows: the prompt's task and language tokens must count.
    damped = _damped_ids(tokenizer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and "encoder" in name:
                continue   # sinusoidal, as transformers made them
            values = _init(name, p.detach().numpy(), rng)
            if name.endswith("embed_tokens.weight"):
                values[damped] *= 0.05
            p.copy_(torch.from_numpy(values))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    _write_tokenizer(path, tokenizer, eot, sot, config.max_target_positions)
    _write_json(path / "preprocessor_config.json", {
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
        "sampling_rate": 16000, "hop_length": 160, "n_fft": 400,
        "chunk_length": clip_seconds, "n_samples": 16000 * clip_seconds,
        "nb_max_frames": 100 * clip_seconds, "padding_side": "right", "padding_value": 0.0,
        "return_attention_mask": False, "processor_class": "WhisperProcessor"})
    return path


def _write_tokenizer(path: Path, tokenizer, eot: int, sot: int, max_len: int) -> None:
    tokenizer.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "WhisperTokenizer", "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "model_max_length": max_len,
        "clean_up_tokenization_spaces": False, "processor_class": "WhisperProcessor"})
    _write_json(path / "generation_config.json", {
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
        "decoder_start_token_id": sot})


def cached_whisper_model(**overrides: Any) -> Path:
    """make_whisper_model once per process (keyed by arguments) into a temp dir
    removed at exit."""
    return cached_build(_build, "whisper", overrides)


def _build(path: Path, family: str, **overrides: Any) -> Path:
    return make_whisper_model(path, **overrides)


def _init(name: str, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if name.endswith("bias"):
        return rng.normal(0.0, 0.1, p.shape).astype(np.float32)
    if p.ndim == 1:   # norms: near their init
        return (p + rng.normal(0.0, 0.1, p.shape)).astype(np.float32)
    if "embed_tokens" in name:
        # Small next to the layers' output: with the head tied to this table, large rows
        # make a random model echo its last token whatever it hears.
        return rng.normal(0.0, 0.3, p.shape).astype(np.float32)
    if "embed" in name:
        return rng.normal(0.0, 1.0, p.shape).astype(np.float32)
    fan_in = int(np.prod(p.shape[1:]))
    owner = name.rsplit(".", 2)[-2]
    gain = 3.0 if owner in ("out_proj", "fc2") else 1.5
    if "encoder_attn.out_proj" in name:
        gain = 6.0   # what the decoder hears weighs most
    w = rng.normal(0.0, gain / np.sqrt(fan_in), p.shape)
    if owner == "fc2":
        # Rows summing to zero: GELU's outputs have a positive mean, which a random
        # projection turns into one direction shared by every token and clip, and the
        # tied head then names one token whatever comes in.
        w -= w.mean(axis=1, keepdims=True)
    return w.astype(np.float32)


def reference_model(path: str | Path):
    """transformers' float32 model of the checkpoint at ``path`` (eval mode)."""
    import torch
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()


def speech_clip() -> Path:
    """A spoken "Hello world." (espeak-ng 1.51: ``espeak-ng -s 170 -w FILE "Hello
    world."``), mono 16-bit PCM at 22050 Hz, 1.06 s: vLLM resamples it to 16 kHz."""
    return Path(__file__).parent / "data" / "hello_world.wav"


def make_clip(seed: int, seconds: float = 1.5, rate: int = 16000) -> np.ndarray:
    """float32 mono samples: a seeded mix of tones that glide, and a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    clip = np.zeros_like(t)
    for _ in range(3):
        f0, f1 = rng.uniform(100, 3000, 2)
        clip += rng.uniform(0.1, 0.4) * np.sin(2 * np.pi * (f0 + (f1 - f0) * t / seconds / 2) * t)
    clip += rng.normal(0.0, 0.02, t.shape)
    return clip.astype(np.float32)


class ReferenceWhisper:
    """transformers' float32 forward of a checkpoint: greedy continuations of a
    decoder prompt over a clip's features, as the checkpoint's processor makes them."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoProcessor

        self.model = reference_model(path)
        self.features = AutoProcessor.from_pretrained(path).feature_extractor

    def greedy(self, prompt_ids: list[int], audio: np.ndarray, max_tokens: int
               ) -> tuple[list[int], list[float]]:
        """(tokens, each token's log-probability in float64), recomputing the whole
        decoder sequence each step (no cache to get wrong)."""
        import torch

        feats = self.features(audio, sampling_rate=self.features.sampling_rate,
                              return_tensors="pt").input_features
        ids = list(prompt_ids)
        tokens, logprobs = [], []
        with torch.no_grad():
            encoded = self.model.model.encoder(feats)
            for _ in range(max_tokens):
                logits = self.model(encoder_outputs=encoded,
                                    decoder_input_ids=torch.tensor([ids])).logits[0, -1]
                lp = torch.log_softmax(logits.double(), -1)
                token = int(lp.argmax())
                tokens.append(token)
                logprobs.append(float(lp[token]))
                ids.append(token)
        return tokens, logprobs
