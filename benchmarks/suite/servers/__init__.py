"""The servers the suite knows, by their --servers key, in the order they run."""

from benchmarks.suite.servers.llama_cpp_python import LlamaCppPython
from benchmarks.suite.servers.llama_server import LlamaServer
from benchmarks.suite.servers.mlx_lm_server import MlxLmServer
from benchmarks.suite.servers.ours import Ours, OursExact, OursMpExecutor
from benchmarks.suite.servers.vllm_mlx import VllmMlx

SERVERS = {cls.name: cls for cls in (Ours, OursExact, OursMpExecutor, LlamaServer, LlamaCppPython,
                                     MlxLmServer, VllmMlx)}
