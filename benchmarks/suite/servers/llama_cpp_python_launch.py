"""Start llama-cpp-python's server with request-id validation off (runs in that peer's venv).

Its server validates `x-request-id` as a UUID and answers 400 otherwise; `vllm bench
serve` sends ids like "benchmark-serving0". The id is only used for logging there.
"""

import runpy

from starlette_context import plugins


class _AnyRequestId(plugins.RequestIdPlugin):
    def __init__(self, *args, **kwargs):
        kwargs["validate"] = False
        super().__init__(*args, **kwargs)


plugins.RequestIdPlugin = _AnyRequestId   # llama_cpp.server.app looks it up at app creation
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
