"""SmolLM2 with int8 activations (VLLM_METAL_CPU_INT8_ACTIVATIONS) against the
same model on fp32 activations: what the rounding costs on a real model."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from vllm_metal.gguf.header import read_header
from vllm_metal.gguf.loader import load_gguf_model
from vllm_metal.gguf.tokenizer import build_tokenizer
from vllm_metal.cpu.fast_linears import use_fast_cpu_linears

TEXT = ("<|im_start|>user\nTell me about the Roman Empire.<|im_end|>\n<|im_start|>assistant\n"
        "The Roman Empire began when Augustus became the first emperor in 27 BC. Over the "
        "next centuries it grew to include the lands around the Mediterranean Sea, joined "
        "by roads, trade and one body of law, and Latin spread across its western provinces.")


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_int8_activations_stay_close_to_fp32_on_smollm2(smollm2_path):
    ids = mx.array([build_tokenizer(read_header(smollm2_path).metadata).encode(TEXT).ids])
    logits = {}
    for int8 in (False, True):
        model, _ = load_gguf_model(smollm2_path, mx.float32)
        assert use_fast_cpu_linears(model, activation_dtype=mx.float32,
                                    int8_activations=int8) > 0
        logits[int8] = np.array(model(ids)[0], dtype=np.float64)
    exact, rounded = _log_softmax(logits[False]), _log_softmax(logits[True])
    kl = (np.exp(exact) * (exact - rounded)).sum(-1)
    agree = (exact.argmax(-1) == rounded.argmax(-1)).mean()
    # Measured: mean KL 0.015-0.017 nats on AVX-512 (VNNI) and AVX2 (portable
    # kernel) hosts; 32 and 29 of the 33 next-token argmaxes agree there, the
    # difference being near-ties that each ISA's summation order settles
    # otherwise. The bounds leave room for that, not for a broken kernel (wrong
    # layouts give near-random logits: agreement < 10%, KL of nats).
    assert agree >= 0.8, agree
    assert kl.mean() < 0.05, kl.mean()
    assert kl.mean() > 0  # the flag took effect


def test_the_q8_0_head_forms_its_biases_from_its_scales(smollm2_path):
    # SmolLM2's tied embedding is Q8_0 (symmetric: bias = -128 * scale); its Q4_1
    # layers carry real biases. With int8 activations the head reads no biases,
    # and gives exactly the logits it gives reading them.
    model, _ = load_gguf_model(smollm2_path, mx.float32)
    use_fast_cpu_linears(model, activation_dtype=mx.float32, int8_activations=True)
    head = model.model.embed_tokens
    assert head.zero_point == 128
    assert all(m.zero_point is None for _, m in model.named_modules()
               if hasattr(m, "zero_point") and m is not head)
    hidden = mx.random.normal((3, head.scales.shape[1] * head.group_size), key=mx.random.key(1))
    formed = head.as_linear(hidden)
    head.zero_point = None
    read = head.as_linear(hidden)
    np.testing.assert_array_equal(np.array(formed), np.array(read))
