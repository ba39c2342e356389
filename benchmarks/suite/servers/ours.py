"""Our server: `vllm-metal serve` (vLLM + this plugin) from the venv running the suite."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from benchmarks.suite.servers.base import Launch, ModelFiles, Server

DEFAULT_ARGS = "--max-model-len 2048 --max-num-seqs 16"
SERVED_NAME = "bench-model"


class Ours(Server):
    name = "ours"
    label = "vllm-metal (`vllm-metal serve`, MLX CPU backend + our kernels, GGUF Q4_1)"
    startup_timeout = 1200.0   # minutes today on 2 cores: model load and warm-up compile

    def __init__(self, cache_root: Path, extra_args: str = DEFAULT_ARGS) -> None:
        super().__init__(cache_root)
        self.extra_args = shlex.split(extra_args)

    def launch(self, models: ModelFiles, port: int) -> Launch:
        cli = Path(sys.executable).with_name("vllm-metal")
        argv = [str(cli), "serve", str(models.gguf), "--served-model-name", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(port), *self.extra_args]
        # Unset, so the server runs in vLLM's default (multiprocess) layout.
        return Launch(argv=argv, model_name=SERVED_NAME, env={})
