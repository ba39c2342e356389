"""The MLX group of an engine's ranks, over MLX's own distributed backends: ring
(TCP; Thunderbolt bridges on Macs) or JACCL (RDMA over Thunderbolt 5).

Set up from vLLM's process group, which every rank has joined by then: each rank
publishes an address it listens on, and MLX's configuration (its rank, the ring's
hostfile or JACCL's coordinator) is derived from the list, so no hostfile is kept
by hand.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile

import mlx.core as mx

from vllm_metal.envs import DISTRIBUTED_BACKENDS


def join_mlx_group(cpu_group, rank: int, world_size: int, same_host: bool,
                   backend: str = "ring"):
    """This process's mx.distributed.Group of ``world_size`` ranks, rank ``rank`` as in
    ``cpu_group`` (a torch.distributed group of the same ranks, e.g. vLLM's world
    group's cpu_group). ``same_host``: every rank runs on this machine (loopback);
    else each rank listens on its address as vLLM finds it (VLLM_HOST_IP first).
    ``backend``: one of DISTRIBUTED_BACKENDS."""
    import torch.distributed as dist

    if backend not in DISTRIBUTED_BACKENDS or not mx.distributed.is_available(backend=backend):
        raise RuntimeError(f"MLX backend {backend!r} is not available in this MLX build; "
                           "use ring")
    host = "127.0.0.1" if same_host else _host_ip()
    addresses: list[str | None] = [None] * world_size
    dist.all_gather_object(addresses, f"{host}:{_free_port(host)}", group=cpu_group)
    config = {"MLX_RANK": str(rank)}
    hostfile = None
    if backend == "ring":
        fd, hostfile = tempfile.mkstemp(prefix="vllm-metal-ring-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump([[a] for a in addresses], f)
        config["MLX_HOSTFILE"] = hostfile
    else:
        if not os.environ.get("MLX_IBV_DEVICES"):
            raise RuntimeError("MLX's jaccl backend needs MLX_IBV_DEVICES, the JSON file of "
                               "each rank's RDMA devices (see MLX's distributed docs); or use "
                               "ring")
        config["MLX_JACCL_COORDINATOR"] = addresses[0]
    os.environ.update(config)
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    finally:
        if hostfile is not None:
            os.unlink(hostfile)
    if (group.rank(), group.size()) != (rank, world_size):
        raise RuntimeError(f"MLX's {backend} group made this process rank {group.rank()} of "
                           f"{group.size()}; vLLM has it as rank {rank} of {world_size}")
    return group


def _host_ip() -> str:
    from vllm.utils.network_utils import get_ip

    ip = get_ip()
    if ":" in ip:
        raise RuntimeError(f"MLX's ring backend takes IPv4 addresses; this host's is {ip}: "
                           "set VLLM_HOST_IP to its IPv4 address")
    return ip


def _free_port(host: str) -> int:
    # A port free now; MLX binds it moments later (a race only with another process
    # binding the same fresh port in between).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
