"""Two processes on this host join an MLX ring group from their torch.distributed
group, then all-sum and pass a hidden state from one to the other."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

RANK = textwrap.dedent("""
    import sys
    import mlx.core as mx
    import torch.distributed as dist
    from vllm_metal.distributed.group import join_mlx_group

    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    group = join_mlx_group(dist.group.WORLD, rank, 2, same_host=True)
    # MLX's collectives carry no tags: every rank runs them in the same order.
    total = mx.distributed.all_sum(mx.array([rank + 1.0]), group=group).item()
    hidden = mx.arange(24, dtype=mx.float32).reshape(6, 4) / 7
    if rank == 0:
        mx.eval(mx.distributed.send(hidden, 1, group=group))
        print("sum", total)
    else:
        got = mx.distributed.recv_like(hidden, 0, group=group)
        print("sum", total, "equal", mx.array_equal(got, hidden).item())
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_join_a_ring_and_pass_a_hidden_state():
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), port],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert outs[0][0].split() == ["sum", "3.0"]
    assert outs[1][0].split() == ["sum", "3.0", "equal", "True"]
