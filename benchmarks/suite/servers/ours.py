"""Our server, `vllm-metal serve` (vLLM + this plugin) from the venv running the suite, in
the process layouts `vllm serve` offers.

vLLM 0.33's `vllm serve` always runs the engine core in a process of its own: its
AsyncLLM builds an AsyncMPClient unconditionally (VLLM_ENABLE_V1_MULTIPROCESSING is
read only by the offline LLMEngine; EngineCoreClient.make_client raises
NotImplementedError for asyncio without multiprocessing). So the layouts to compare
are two processes (API server; engine core with the model worker inside: the uni
executor, the default) and three (the worker split out by the mp executor).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from benchmarks.suite.servers.base import Launch, ModelFiles, Server

DEFAULT_ARGS = "--max-model-len 2048 --max-num-seqs 16"
SERVED_NAME = "bench-model"


class Ours(Server):
    name = "ours"
    label = ("vllm-metal (`vllm-metal serve`, MLX CPU backend + our kernels, the GGUF "
             "with its defaults: int8 activations, fp16 KV cache; API server + engine "
             "core: 2 processes)")
    startup_timeout = 1200.0   # minutes on a loaded 2-core machine: model load and warm-up
    layout_args: tuple[str, ...] = ()   # appended to the shared --ours-args
    env: dict[str, str] = {}            # added to the server's environment

    def __init__(self, cache_root: Path, extra_args: str = DEFAULT_ARGS) -> None:
        super().__init__(cache_root)
        self.extra_args = shlex.split(extra_args)

    def launch(self, models: ModelFiles, port: int) -> Launch:
        cli = Path(sys.executable).with_name("vllm-metal")
        argv = [str(cli), "serve", str(models.gguf), "--served-model-name", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(port), *self.extra_args, *self.layout_args]
        return Launch(argv=argv, model_name=SERVED_NAME, env=dict(self.env))


class OursMpExecutor(Ours):
    name = "ours-mp"
    label = ("vllm-metal, same server with the model worker in its own process "
             "(`--distributed-executor-backend mp`: 3 processes)")
    layout_args = ("--distributed-executor-backend", "mp")


class OursExact(Ours):
    name = "ours-exact"
    label = ("vllm-metal, same server with the fast path switched off: fp32 activations "
             "and an fp32 KV cache, mlx-lm's arithmetic (`VLLM_METAL_CPU_INT8_ACTIVATIONS=0`)")
    env = {"VLLM_METAL_CPU_INT8_ACTIVATIONS": "0"}
