"""vllm-mlx 0.6.0 (pins mlx-lm < 0.32) with continuous batching, on the MLX 4-bit checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.suite.install import ensure_venv
from benchmarks.suite.servers.base import Launch, ModelFiles, Server

PACKAGES = ["vllm-mlx==0.6.0", "mlx[cpu]==0.32.4"]
# It persists a prefix cache here at shutdown, one directory per model path with "/"
# spelled "--"; left in place, the next run would start warm.
PREFIX_CACHE = Path("~/.cache/vllm-mlx/prefix_cache")
SERVED_NAME = "bench-model"
# Its default (300 s) cuts a stream that sends nothing for that long; at c=16 on 2 cores
# the last prompts of a wave wait ~300 s for their first token.
REQUEST_TIMEOUT_S = 3600


class VllmMlx(Server):
    name = "vllm-mlx"
    label = "vllm-mlx 0.6.0 (continuous batching, MLX CPU, 4-bit g32, fp32 scales)"
    needs_mlx_model = True

    def __init__(self, cache_root: Path) -> None:
        super().__init__(cache_root)
        self.prefix_cache: Path | None = None

    def install(self) -> None:
        ensure_venv(self.root / "venv", PACKAGES, self.log)

    def launch(self, models: ModelFiles, port: int) -> Launch:
        self.prefix_cache = PREFIX_CACHE.expanduser() / str(models.mlx_dir).replace("/", "--")
        shutil.rmtree(self.prefix_cache, ignore_errors=True)
        cli = self.root / "venv" / "bin" / "vllm-mlx"
        argv = [str(cli), "serve", str(models.mlx_dir), "--host", "127.0.0.1", "--port", str(port),
                "--continuous-batching", "--served-model-name", SERVED_NAME, "--offline",
                "--timeout", str(REQUEST_TIMEOUT_S)]
        return Launch(argv=argv, model_name=SERVED_NAME, health_path="/health")

    def after_stop(self) -> None:
        if self.prefix_cache is not None:
            shutil.rmtree(self.prefix_cache, ignore_errors=True)
