"""vllm-mlx 0.6.0 (pins mlx-lm < 0.32) with continuous batching, on the MLX 4-bit checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.suite.install import ensure_venv
from benchmarks.suite.servers.base import Launch, ModelFiles, Server

PACKAGES = ["vllm-mlx==0.6.0", "mlx[cpu]==0.32.4"]
# It writes a prefix cache here at shutdown; left in place, the next run would start warm.
PREFIX_CACHE = Path("~/.cache/vllm-mlx")
SERVED_NAME = "bench-model"


class VllmMlx(Server):
    name = "vllm-mlx"
    label = "vllm-mlx 0.6.0 (continuous batching, MLX CPU, 4-bit g32, fp32 scales)"
    needs_mlx_model = True

    def install(self) -> None:
        ensure_venv(self.root / "venv", PACKAGES, self.log)

    def launch(self, models: ModelFiles, port: int) -> Launch:
        shutil.rmtree(PREFIX_CACHE.expanduser(), ignore_errors=True)
        cli = self.root / "venv" / "bin" / "vllm-mlx"
        argv = [str(cli), "serve", str(models.mlx_dir), "--host", "127.0.0.1", "--port", str(port),
                "--continuous-batching", "--served-model-name", SERVED_NAME, "--offline"]
        return Launch(argv=argv, model_name=SERVED_NAME, health_path="/health")

    def after_stop(self) -> None:
        shutil.rmtree(PREFIX_CACHE.expanduser(), ignore_errors=True)
