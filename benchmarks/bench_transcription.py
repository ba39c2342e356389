"""Speech-to-text real-time factor: ours (vllm.LLM in this process, the path
`vllm serve`'s /v1/audio/transcriptions takes) against transformers' own Whisper
`generate` on the same checkpoint (torch on the same cores).

    python benchmarks/bench_transcription.py [--shapes tiny base small] [--tokens 100]

Random-weight float32 checkpoints of Whisper's published shapes (vocabulary 51865,
30-second windows: 1500 encoder rows, 448 decoder positions), written to the bench
cache on first use. The clip: 30 s of a spoken sentence (espeak-ng's, the tests'
clip repeated). Each run decodes ``--tokens`` tokens (EOS ignored: random weights
would stop anywhere) after the four-token prompt. Figures: time to the first token
(the encoder and the prompt), the whole request alone, its real-time factor
(seconds of compute per second of audio; below 1 is faster than real time), and
with four clips in one call, audio seconds transcribed per wall second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

CACHE = Path(os.environ.get("VLLM_METAL_BENCH_CACHE",
                            Path.home() / ".cache" / "vllm-metal-bench")) / "models"
SECONDS = 30
PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"

SHAPES = {
    "tiny": dict(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                 decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536),
    "base": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048),
    "small": dict(d_model=768, encoder_layers=12, decoder_layers=12,
                  encoder_attention_heads=12, decoder_attention_heads=12,
                  encoder_ffn_dim=3072, decoder_ffn_dim=3072),
}


def checkpoint(name: str) -> Path:
    from tests.speech_models import make_whisper_model

    path = CACHE / f"whisper-{name}"
    if (path / "preprocessor_config.json").exists():
        return path
    return make_whisper_model(path, clip_seconds=SECONDS, vocab_size=51865,
                              max_target_positions=448, **SHAPES[name])


def clip(seed: int = 0) -> np.ndarray:
    """30 s at 16 kHz: the spoken clip, repeated with a seeded gain per repeat."""
    import io

    from vllm.multimodal.media.audio import load_audio

    from tests.speech_models import speech_clip

    speech, _ = load_audio(io.BytesIO(speech_clip().read_bytes()), sr=16000, mono=True)
    speech = np.asarray(speech, np.float32)
    rng = np.random.default_rng(seed)
    reps = -(-SECONDS * 16000 // len(speech))
    out = np.concatenate([speech * rng.uniform(0.5, 1.0) for _ in range(reps)])
    return out[: SECONDS * 16000]


def ours(path: Path, tokens: int) -> tuple[float, float, float]:
    """(seconds to the first token, seconds for the request alone, audio s / wall s for
    four in one call)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(path), max_model_len=448, max_num_seqs=4,
              gpu_memory_utilization=0.5, seed=0)

    def run(clips, n):
        params = SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0,
                                ignore_eos=True, detokenize=False)
        prompts = [{"encoder_prompt": {"prompt": "",
                                       "multi_modal_data": {"audio": (c, 16000)}},
                    "decoder_prompt": PROMPT} for c in clips]
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    run([clip(9)], 2)   # warm
    first = statistics.median(run([clip(s)], 1) for s in range(3))
    whole = statistics.median(run([clip(s)], tokens) for s in range(3))
    four = run([clip(s) for s in range(4)], tokens)
    return first, whole, 4 * SECONDS / four


def reference(path: Path, tokens: int) -> tuple[float, float, float]:
    """transformers' Whisper.generate, greedy: the same three figures (four clips as one
    padded batch)."""
    import torch
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    torch.set_num_threads(2)
    features = AutoProcessor.from_pretrained(str(path)).feature_extractor
    model = WhisperForConditionalGeneration.from_pretrained(str(path),
                                                            dtype=torch.float32).eval()
    ids = AutoProcessor.from_pretrained(str(path)).tokenizer(
        PROMPT, add_special_tokens=False).input_ids

    def run(clips, n):
        start = time.perf_counter()   # the log-mel features count, as vLLM's processor's do
        feats = features(clips, sampling_rate=16000, return_tensors="pt").input_features
        with torch.inference_mode():
            encoded = model.model.encoder(feats)
            model.generate(encoder_outputs=encoded,
                           decoder_input_ids=torch.tensor([ids] * len(clips)),
                           max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - start

    run([clip(9)], 2)
    first = statistics.median(run([clip(s)], 1) for s in range(3))
    whole = statistics.median(run([clip(s)], tokens) for s in range(3))
    four = run([clip(s) for s in range(4)], tokens)
    return first, whole, 4 * SECONDS / four


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tokens", type=int, default=100)
    args = parser.parse_args()
    print(f"| shape | runner | first token s | {args.tokens} tokens s | RTF alone | "
          "4 clips: audio s / wall s |")
    print("|---|---|---|---|---|---|")
    for name in args.shapes:
        path = checkpoint(name)
        for label, run in (("vllm-metal", ours), ("transformers (torch)", reference)):
            first, whole, rate = run(path, args.tokens)
            print(f"| whisper-{name} | {label} | {first:.2f} | {whole:.2f} | "
                  f"{whole / SECONDS:.3f} | {rate:.1f} |", flush=True)


if __name__ == "__main__":
    main()
