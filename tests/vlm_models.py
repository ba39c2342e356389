"""Tiny random-weight vision-language checkpoints, built with transformers.

`make_vlm_model(path, kind)` instantiates transformers' own class for the kind
(LLaVA: a CLIP tower, a two-layer projector and a Llama; Qwen2.5-VL: its
windowed ViT with the 2x2 merger and a Qwen2 with M-RoPE; Qwen2-VL: the same with
full attention in every block; Gemma 3: a SigLIP tower pooled to 16 image tokens
and a Gemma 3 with a sliding and a global layer, whose image tokens attend
to their whole image; Qwen3-VL: its ViT with deepstack mergers and a Qwen3 with
interleaved M-RoPE) from a small config,
refills its parameters with seeded values scaled for wide greedy margins (as
tests/family_models.py does for text models), and saves it with
``save_pretrained`` (transformers 5's key layout), with the byte-level BPE
tokenizer of tests/tiny_models.py plus the kind's image tokens, a chat template
that places them, and the kind's image processor config. transformers' own
forward of the saved checkpoint is the reference the tests compare with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.tiny_models import (BOS, EOS, PAD, _damped_ids, _train_tokenizer, _write_json,
                               cached_build)

VOCAB = 1024
TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0)
IMAGE_SIZE = 32          # LLaVA's CLIP input side (pixels)
PATCH = 8                # LLaVA: (32 / 8)^2 = 16 image tokens per image

# Chat: each message's content is a string or a list of parts; an image part
# becomes the kind's image placeholder text.
_CHAT = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}{{ IMAGE }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

KINDS = ("llava", "qwen2_5_vl", "qwen2_vl", "gemma3", "qwen3_vl")
GEMMA3_WINDOW = 48       # the sliding layer's window: longer than an image (16 tokens)
# kind -> (added special tokens, the placeholder text an image part renders as)
_TOKENS = {
    "llava": (["<image>"], "<image>"),
    "qwen2_5_vl": (["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
                   "<|vision_start|><|image_pad|><|vision_end|>"),
}
_TOKENS["qwen2_vl"] = _TOKENS["qwen3_vl"] = _TOKENS["qwen2_5_vl"]
# Gemma 3's chat template writes <start_of_image>; its processor expands it into
# "\n\n<start_of_image>" + 16 x <image_soft_token> + "<end_of_image>\n\n".
_TOKENS["gemma3"] = (["<start_of_image>", "<end_of_image>", "<image_soft_token>"],
                     "<start_of_image>")

_GAIN = {"o_proj": 3.0, "down_proj": 3.0, "out_proj": 2.0, "fc2": 2.0, "proj": 2.0,
         "linear_2": 2.0}
_DEFAULT_GAIN = 1.5
_SPECIAL_ROW_SCALE = 0.05


def make_vlm_model(path: str | Path, kind: str = "llava", *, seed: int = 0,
                   **text_overrides: Any) -> Path:
    """Write a tiny ``kind`` checkpoint (see KINDS) at ``path``; returns it."""
    import torch

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise ValueError(f"path {str(path)!r} exists and is not empty")
    added, placeholder = _TOKENS[kind]
    tokenizer = _train_tokenizer(VOCAB)
    tokenizer.add_special_tokens(added)
    if kind == "gemma3":
        # vLLM's Gemma 3 processor merges the newlines around an image into the
        # single tokens Gemma's vocabulary has for runs of them.
        tokenizer.add_tokens(["\n", "\n\n", "\n\n\n", "\n\n\n\n"])
    ids = {t: tokenizer.token_to_id(t) for t in added}
    vocab = tokenizer.get_vocab_size()
    config = _CONFIGS[kind](vocab, ids, tokenizer, text_overrides)
    torch.manual_seed(seed)
    model = _model_class(kind)(config).eval()
    rng = np.random.default_rng(seed)
    damped = sorted(set(_damped_ids(tokenizer)) | set(ids.values()))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(_init(name, p.detach().numpy(), rng, vocab, damped)))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    _write_tokenizer(path, tokenizer, placeholder, config)
    _write_processor(path, kind)
    return path


def cached_vlm_model(kind: str = "llava", **overrides: Any) -> Path:
    """Build once per process (keyed by arguments) into a temp dir removed at exit."""
    return cached_build(make_vlm_model, kind, overrides)


def reference_model(path: str | Path):
    """transformers' float32 model of the checkpoint at ``path`` (eval mode)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    kind = config.model_type
    return _model_class(kind).from_pretrained(path, dtype=torch.float32).eval()


def _model_class(kind: str):
    import transformers

    return {"llava": transformers.LlavaForConditionalGeneration,
            "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
            "qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
            "gemma3": transformers.Gemma3ForConditionalGeneration,
            "qwen3_vl": transformers.Qwen3VLForConditionalGeneration}[kind]


def _text(vocab: int, tokenizer, overrides: dict) -> dict:
    return {**TEXT, **overrides, "vocab_size": vocab,
            "bos_token_id": tokenizer.token_to_id(BOS),
            "eos_token_id": tokenizer.token_to_id(EOS),
            "pad_token_id": tokenizer.token_to_id(PAD)}


def _llava_config(vocab: int, ids: dict, tokenizer, overrides: dict):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                              num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                              projection_dim=64)
    text = LlamaConfig(**_text(vocab, tokenizer, overrides), tie_word_embeddings=False)
    return LlavaConfig(vision_config=vision, text_config=text,
                       image_token_index=ids["<image>"], projector_hidden_act="gelu",
                       vision_feature_layer=-2, vision_feature_select_strategy="default",
                       tie_word_embeddings=False)


def _qwen2_5_vl_config(vocab: int, ids: dict, tokenizer, overrides: dict):
    from transformers import Qwen2_5_VLConfig

    text = {**_text(vocab, tokenizer, overrides), "model_type": "qwen2_5_vl_text",
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": [4, 6, 6]}}
    text.pop("head_dim")   # Qwen2 derives it: hidden / heads = 32, half of it 16
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4,
                  out_hidden_size=TEXT["hidden_size"], patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                  in_chans=3)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                            image_token_id=ids["<|image_pad|>"],
                            video_token_id=ids["<|video_pad|>"],
                            vision_start_token_id=ids["<|vision_start|>"],
                            vision_end_token_id=ids["<|vision_end|>"],
                            tie_word_embeddings=True)


def _qwen2_vl_config(vocab: int, ids: dict, tokenizer, overrides: dict):
    from transformers import Qwen2VLConfig

    text = {**_text(vocab, tokenizer, overrides), "model_type": "qwen2_vl_text",
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": [4, 6, 6]}}
    text.pop("head_dim")
    # Qwen2-VL's ViT: full attention in every block, a LayerNorm'd MLP merger.
    vision = dict(depth=2, embed_dim=64, hidden_size=TEXT["hidden_size"], num_heads=4,
                  mlp_ratio=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  in_chans=3)
    return Qwen2VLConfig(text_config=text, vision_config=vision,
                         image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                         vision_start_token_id=ids["<|vision_start|>"],
                         vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=True)


def _gemma3_config(vocab: int, ids: dict, tokenizer, overrides: dict):
    from transformers import Gemma3Config

    # hidden 64: the embedding scale sqrt(64) = 8 is exact in bfloat16, as mlx-lm rounds it.
    text = {**_text(vocab, tokenizer, overrides), "model_type": "gemma3_text",
            "hidden_size": 64, "intermediate_size": 128, "head_dim": 64,
            "query_pre_attn_scalar": 64, "sliding_window": GEMMA3_WINDOW,
            # Untied: with a tied head the scaled input embedding dominates the last
            # hidden state and a tiny model only repeats its last token.
            "tie_word_embeddings": False,
            "sliding_window_pattern": 2, "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}
    vision = dict(model_type="siglip_vision_model", hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, image_size=64, patch_size=8,
                  layer_norm_eps=1e-6, vision_use_head=False)
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=16,
                        boi_token_index=ids["<start_of_image>"],
                        eoi_token_index=ids["<end_of_image>"],
                        image_token_index=ids["<image_soft_token>"], tie_word_embeddings=False)


def _qwen3_vl_config(vocab: int, ids: dict, tokenizer, overrides: dict):
    from transformers import Qwen3VLConfig

    # Three layers, two deepstack levels: the first two layers add the image's rows,
    # the third does not. Interleaved M-RoPE over head_dim 32's 16 frequencies.
    text = {**_text(vocab, tokenizer, overrides), "model_type": "qwen3_vl_text",
            "num_hidden_layers": 3,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": [6, 5, 5], "mrope_interleaved": True}}
    # Its ViT: patch 16, learned positions on a 16 x 16 grid (interpolated), deepstack
    # mergers after blocks 0 and 1.
    vision = dict(depth=3, hidden_size=64, intermediate_size=128, num_heads=4,
                  out_hidden_size=TEXT["hidden_size"], patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, num_position_embeddings=256,
                  deepstack_visual_indexes=[0, 1], in_channels=3)
    return Qwen3VLConfig(text_config=text, vision_config=vision,
                         image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                         vision_start_token_id=ids["<|vision_start|>"],
                         vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)


_CONFIGS = {"llava": _llava_config, "qwen2_5_vl": _qwen2_5_vl_config,
            "qwen2_vl": _qwen2_vl_config, "gemma3": _gemma3_config,
            "qwen3_vl": _qwen3_vl_config}


def _init(name: str, p: np.ndarray, rng: np.random.Generator, vocab: int,
          damped: list[int]) -> np.ndarray:
    leaf = name.rsplit(".", 1)[-1]
    owner = name.rsplit(".", 2)[-2] if name.count(".") else ""
    if leaf == "bias":
        return rng.normal(0.0, 0.1, p.shape).astype(np.float32)
    if p.ndim == 1:   # norms: near their init
        return (p + rng.normal(0.0, 0.1, p.shape)).astype(np.float32)
    if p.shape[0] == vocab:   # token embeddings or the LM head
        rows = rng.normal(0.0, 1.0, p.shape).astype(np.float32)
        rows[damped] *= _SPECIAL_ROW_SCALE
        return rows
    if p.ndim != 2:   # patch convolutions: fan-in is everything but the output channel
        fan_in = int(np.prod(p.shape[1:]))
        return rng.normal(0.0, 1.0 / np.sqrt(fan_in), p.shape).astype(np.float32)
    if "position" in name:   # learned position tables
        return rng.normal(0.0, 0.5, p.shape).astype(np.float32)
    if leaf == "mm_input_projection_weight":
        # Gemma 3's image rows as large as its text rows, which the model scales by
        # sqrt(hidden) = 8: otherwise the picture hardly moves the answer.
        return rng.normal(0.0, 8.0 / np.sqrt(p.shape[0]), p.shape).astype(np.float32)
    gain = _GAIN.get(owner, _DEFAULT_GAIN)
    return rng.normal(0.0, gain / np.sqrt(p.shape[1]), p.shape).astype(np.float32)


def _write_tokenizer(path: Path, tokenizer, placeholder: str, config) -> None:
    text = config.text_config
    template = _CHAT.replace("IMAGE", repr(placeholder))
    tokenizer.save(str(path / "tokenizer.json"))
    extra = {}
    if config.model_type == "gemma3":   # the names Gemma 3's processor reads
        extra = {"extra_special_tokens": {"boi_token": "<start_of_image>",
                                          "eoi_token": "<end_of_image>",
                                          "image_token": "<image_soft_token>"}}
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "pad_token": PAD, "model_max_length": TEXT["max_position_embeddings"],
        "clean_up_tokenization_spaces": False, "chat_template": template, **extra})
    _write_json(path / "chat_template.json", {"chat_template": template})
    _write_json(path / "generation_config.json", {
        "bos_token_id": text.bos_token_id, "eos_token_id": text.eos_token_id,
        "pad_token_id": text.pad_token_id})


def _write_processor(path: Path, kind: str) -> None:
    if kind == "llava":
        _write_json(path / "preprocessor_config.json", {
            "image_processor_type": "CLIPImageProcessor", "do_resize": True,
            "size": {"shortest_edge": IMAGE_SIZE}, "do_center_crop": True,
            "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True})
        _write_json(path / "processor_config.json", {
            "processor_class": "LlavaProcessor", "patch_size": PATCH,
            "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1,
            "image_token": "<image>"})
    elif kind == "gemma3":
        _write_json(path / "preprocessor_config.json", {
            "image_processor_type": "Gemma3ImageProcessor", "do_resize": True,
            "size": {"height": 64, "width": 64}, "resample": 2, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "do_pan_and_scan": False})
        _write_json(path / "processor_config.json", {"processor_class": "Gemma3Processor",
                                                     "image_seq_length": 16})
    elif kind == "qwen3_vl":
        # 32-pixel units (patch 16 x merge 2).
        image = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                 "size": {"shortest_edge": 32 * 32, "longest_edge": 32 * 32 * 16},
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
        _write_json(path / "preprocessor_config.json",
                    {"image_processor_type": "Qwen2VLImageProcessorFast", **image})
        _write_json(path / "video_preprocessor_config.json",
                    {"video_processor_type": "Qwen3VLVideoProcessor", **image})
        _write_json(path / "processor_config.json", {"processor_class": "Qwen3VLProcessor"})
    else:
        # 28-pixel units (patch 14 x merge 2); small images stay a few patches.
        processor = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}[kind]
        _write_json(path / "preprocessor_config.json", {
            "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14,
            "temporal_patch_size": 2, "merge_size": 2,
            "size": {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 16},
            "min_pixels": 28 * 28, "max_pixels": 28 * 28 * 16,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711]})
        _write_json(path / "processor_config.json", {"processor_class": processor})


def make_image(seed: int, size: tuple[int, int] = (48, 40)):
    """A seeded random RGB picture (PIL), ``size`` (width, height)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


class ReferenceVLM:
    """transformers' float32 forward of a checkpoint: greedy continuations of a
    prompt (token ids, as the engine rendered it) with its images, in order."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoProcessor

        self.model = reference_model(path)
        # vLLM's processor resizes with torchvision; AutoProcessor's default turns to PIL
        # once vLLM is loaded, whose resampling differs in the last bits of a pixel.
        self.images = AutoProcessor.from_pretrained(path, backend="torchvision").image_processor

    def greedy(self, prompt_ids: list[int], images: list, max_tokens: int
               ) -> tuple[list[int], list[float]]:
        """(tokens, each token's log-probability in float64), recomputing the whole
        sequence each step (no cache to get wrong)."""
        import torch

        extra = {}
        if images:
            batch = self.images(images, return_tensors="pt")
            extra = {k: torch.as_tensor(v) for k, v in batch.items()}
        ids = list(prompt_ids)
        tokens, logprobs = [], []
        for _ in range(max_tokens):
            x = torch.tensor([ids])
            if self.model.config.model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
                # Without the token types transformers silently rotates at 1-D positions.
                extra["mm_token_type_ids"] = (x == self.model.config.image_token_id).int()
            elif self.model.config.model_type == "gemma3":
                # Without them an image's tokens attend causally, not to the whole image.
                extra["token_type_ids"] = (x == self.model.config.image_token_id).int()
            with torch.no_grad():
                logits = self.model(input_ids=x, attention_mask=torch.ones_like(x),
                                    **extra).logits[0, -1].double()
            lp = torch.log_softmax(logits, -1)
            token = int(lp.argmax())
            tokens.append(token)
            logprobs.append(float(lp[token]))
            ids.append(token)
        return tokens, logprobs
