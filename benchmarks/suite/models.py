"""The model in every form the servers take, made once from the GGUF and cached.

- the GGUF itself (ours, llama-server, llama-cpp-python);
- an HF tokenizer dir (the bench client tokenizes with it);
- an MLX 4-bit checkpoint with fp32 scales for the MLX peers: transformers writes an
  fp32 HF checkpoint out of the GGUF, then `mlx_lm.convert -q --q-bits 4
  --q-group-size 32 --dtype float32` (bf16 scales are ~8x slower on MLX's CPU backend).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from benchmarks.suite.install import run_logged
from benchmarks.suite.servers.base import ModelFiles

REPO = Path(__file__).resolve().parents[2]
MLX_CONVERT_FLAGS = ["-q", "--q-bits", "4", "--q-group-size", "32", "--dtype", "float32"]


def model_key(gguf: Path) -> str:
    """Cache key of a model file: its name, size and mtime."""
    st = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    return f"{gguf.stem}-{digest[:12]}"


def tokenizer_dir(gguf: Path) -> Path:
    """HF config + tokenizer files for the GGUF, via our loader's own cache."""
    from vllm_metal.gguf.loader import materialize_hf_dir

    return materialize_hf_dir(gguf)


def mlx_4bit_dir(gguf: Path, cache_root: Path) -> Path:
    """The fp32-scale MLX 4-bit checkpoint of `gguf`, built on first use."""
    root = cache_root / "models" / model_key(gguf)
    out = root / "mlx-4bit-g32-fp32"
    if (out / "config.json").exists():
        return out
    log = cache_root / "logs" / "convert-model.log"
    hf = root / "hf-fp32"
    if not (hf / "config.json").exists():
        hf_tmp = root / "hf-tmp"
        shutil.rmtree(hf_tmp, ignore_errors=True)
        run_logged([sys.executable, "-m", "benchmarks.suite.gguf_to_hf", str(gguf), str(hf_tmp)],
                   log, cwd=REPO)
        shutil.rmtree(hf, ignore_errors=True)
        hf_tmp.rename(hf)
    tmp = root / "mlx-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    convert = Path(sys.executable).with_name("mlx_lm.convert")
    run_logged([str(convert), "--hf-path", str(hf), "--mlx-path", str(tmp), *MLX_CONVERT_FLAGS], log)
    tmp.rename(out)   # only a finished conversion gets the final name
    return out


def model_files(gguf: Path, cache_root: Path, need_mlx: bool) -> ModelFiles:
    return ModelFiles(gguf=gguf, tokenizer_dir=tokenizer_dir(gguf),
                      mlx_dir=mlx_4bit_dir(gguf, cache_root) if need_mlx else None)
