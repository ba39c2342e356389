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

WHISPER = dict(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
               decoder_attention_heads=2, encoder_ffn_dim=256, decoder_ffn_dim=256,
               num_mel_bins=80, max_source_positions=64, max_target_positions=64,
               vocab_size=512)


def make_whisper_model(path: str | Path, *, seed: int = 0, **overrides: Any) -> Path:
    """Write a tiny Whisper checkpoint at ``path``; returns it."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    path = Path(path)
    config = WhisperConfig(**{**WHISPER, **overrides}, decoder_start_token_id=1,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and "encoder" in name:
                continue   # sinusoidal, as transformers made them
            p.copy_(torch.from_numpy(_init(name, p.detach().numpy(), rng)))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path


def _init(name: str, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if name.endswith("bias"):
        return rng.normal(0.0, 0.1, p.shape).astype(np.float32)
    if p.ndim == 1:   # norms: near their init
        return (p + rng.normal(0.0, 0.1, p.shape)).astype(np.float32)
    if "embed" in name:
        return rng.normal(0.0, 1.0, p.shape).astype(np.float32)
    fan_in = int(np.prod(p.shape[1:]))
    gain = 3.0 if name.rsplit(".", 2)[-2] in ("out_proj", "fc2") else 1.5
    return rng.normal(0.0, gain / np.sqrt(fan_in), p.shape).astype(np.float32)


def reference_model(path: str | Path):
    """transformers' float32 model of the checkpoint at ``path`` (eval mode)."""
    import torch
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
