"""Write an fp32 Hugging Face checkpoint (weights + tokenizer) out of a GGUF with transformers.

    python -m benchmarks.suite.gguf_to_hf MODEL.gguf OUT_DIR

Runs in our venv (torch, transformers, gguf, accelerate); the MLX peers' model is
converted from OUT_DIR, so every server starts from the same GGUF.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.suite.gguf_to_hf MODEL.gguf OUT_DIR")
    gguf, out = Path(sys.argv[1]), sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # transformers dequantized the GGUF to fp32 on load but still marks the model as
    # GGUF-quantized, which save_pretrained refuses: drop the marker, the weights are plain.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
