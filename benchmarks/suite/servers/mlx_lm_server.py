"""mlx_lm.server (mlx-lm 0.32, MLX CPU backend) on the fp32-scale 4-bit MLX checkpoint."""

from __future__ import annotations

from benchmarks.suite.install import ensure_venv
from benchmarks.suite.servers.base import Launch, ModelFiles, Server

PACKAGES = ["mlx-lm==0.32.2", "mlx[cpu]==0.32.4"]


class MlxLmServer(Server):
    name = "mlx_lm.server"
    label = "mlx_lm.server 0.32 (MLX CPU, 4-bit g32, fp32 scales)"
    needs_mlx_model = True

    def install(self) -> None:
        ensure_venv(self.root / "venv", PACKAGES, self.log)

    def launch(self, models: ModelFiles, port: int) -> Launch:
        server = self.root / "venv" / "bin" / "mlx_lm.server"
        argv = [str(server), "--model", str(models.mlx_dir), "--host", "127.0.0.1",
                "--port", str(port), "--decode-concurrency", "32", "--prompt-concurrency", "8"]
        # It rejects the client's `"logprobs": null`; "default_model" is the --model it loaded.
        return Launch(argv=argv, model_name="default_model", extra_body={"logprobs": False},
                      health_path="/health")
