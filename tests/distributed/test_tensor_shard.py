"""Tensor-parallel shards: how heads split over ranks (every head held once, each
rank's query heads over its own KV heads, one shape on every rank), and two ranks
of a sharded mlx-lm model over MLX's ring computing the whole model's logits."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.family_models import make_family_model
from vllm_metal.distributed.tensor import (HeadSplit, TensorParallelError, TensorShard,
                                           shard_model)
from vllm_metal.models.adapter import backbone_layers

SPLITS = [(h, kv, n) for kv in (1, 2, 3, 4, 8) for h in (kv, 2 * kv, 3 * kv, 4 * kv)
          for n in (2, 3, 4, 8)]


@pytest.mark.parametrize("heads,kv_heads,size", SPLITS)
def test_every_head_is_held_and_each_rank_attends_its_own_kv_heads(heads, kv_heads, size):
    try:
        splits = [HeadSplit.of(heads, kv_heads, r, size) for r in range(size)]
    except TensorParallelError:
        # Refused only where ranks cannot share KV heads evenly or get no query head.
        assert kv_heads < size and (size % kv_heads or heads // kv_heads < size // kv_heads)
        return
    group = heads // kv_heads
    held = [q for s in splits for q in range(s.q_start, s.q_end)]
    if kv_heads >= size:
        assert held == list(range(heads))     # each query head on exactly one rank
    else:
        assert sorted(held) == list(range(heads))
    assert len({(s.q_local, s.kv_local) for s in splits}) == 1   # one KV cache shape
    for s in splits:
        assert 1 <= s.kv_real <= s.kv_local and 1 <= s.q_real <= s.q_local
        assert s.q_local % s.kv_local == 0
        # Local query head j attends local KV head j // (q_local / kv_local): the
        # real ones must land on the real KV head of their group.
        ratio = s.q_local // s.kv_local
        for j, q in enumerate(range(s.q_start, s.q_end)):
            assert s.kv_start + j // ratio == q // group
    if kv_heads >= size:
        assert splits[0].kv_local == -(-kv_heads // size)   # padded to the most any holds


def test_smollm2_heads_on_two_ranks():
    # 9 query heads over 3 KV heads: one rank holds one KV head and pads a phantom.
    a, b = (HeadSplit.of(9, 3, r, 2) for r in range(2))
    assert (a.q_start, a.q_end, a.kv_start, a.kv_end) == (0, 3, 0, 1)
    assert (b.q_start, b.q_end, b.kv_start, b.kv_end) == (3, 9, 1, 3)
    assert (a.q_local, a.kv_local) == (b.q_local, b.kv_local) == (6, 2)


@pytest.mark.parametrize("family,message", [
    ("olmo2", "q_norm.weight"),             # a norm over all heads' queries
    ("deepseek_v3", "no q/k/v"),             # latent attention
    ("qwen3_next", "no attention module"),   # linear-attention layers
])
def test_layers_it_cannot_shard_are_refused_by_name(family, message, tmp_path):
    from mlx_lm.utils import load_model

    model, _ = load_model(make_family_model(tmp_path / family, family), lazy=True)
    with pytest.raises(TensorParallelError, match=f"{family}: layer 0.*{message}"):
        shard_model(backbone_layers(model), TensorShard(0, 2), family)


# Each rank shards every model, runs mlx-lm's own forward and prints what it got.
RANK = textwrap.dedent("""
    import hashlib, json, sys
    from pathlib import Path
    import mlx.core as mx
    import numpy as np
    import torch.distributed as dist
    from mlx_lm.utils import load_model
    from vllm_metal.distributed.group import join_mlx_group
    from vllm_metal.distributed.tensor import TensorShard, shard_model
    from vllm_metal.models.adapter import backbone_layers

    rank, port, paths = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    group = join_mlx_group(dist.group.WORLD, rank, 2, same_host=True)
    ids = mx.array(np.random.default_rng(0).integers(5, 1000, size=(1, 13)), dtype=mx.int32)
    for path in paths:
        whole, _ = load_model(Path(path), lazy=True)
        want = whole(ids).astype(mx.float32)
        for gather in (False, True):
            model, _ = load_model(Path(path), lazy=True)
            shard_model(backbone_layers(model), TensorShard(rank, 2, group, gather), "test")
            got = model(ids).astype(mx.float32)
            mx.eval(want, got)
            print(json.dumps({
                "error": (mx.abs(got - want).max() / mx.abs(want).max()).item(),
                "same_argmax": mx.array_equal(got.argmax(-1), want.argmax(-1)).item(),
                "equal": mx.array_equal(got, want).item(),
                "bits": hashlib.sha1(np.array(got).tobytes()).hexdigest()}))
""")

# (family, overrides): uneven heads with 4-bit weights in groups of 32 (SmolLM2's
# shape), q/k norms, a sliding-window pattern with scaled embeddings, phi's names,
# phi3's fused qkv and gate_up projections,
# one KV head shared by both ranks.
SHARDED = [("llama", dict(num_attention_heads=6, num_key_value_heads=3, quantize_bits=4,
                          group_size=32)),
           ("qwen3", {}), ("gemma3_text", {}), ("phi", {}), ("phi3", {}),
           ("llama", dict(num_key_value_heads=1))]
# Mixture-of-experts blocks (experts' columns split, partial outputs summed, also when
# the attention gathers): Mixtral's names, a shared expert behind a gate (Qwen2-MoE),
# 4-bit experts (Qwen3-MoE), PhiMoE, shared experts beside sigmoid routing after a
# dense first layer (GLM-4-MoE), ERNIE 4.5 MoE.
SUMMED_EXPERTS = [("mixtral", {}), ("qwen2_moe", {}),
                  ("qwen3_moe", dict(quantize_bits=4, group_size=32)), ("phimoe", {}),
                  ("glm4_moe", {}), ("ernie4_5_moe", {})]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_compute_the_whole_models_logits(tmp_path):
    cases = SHARDED + SUMMED_EXPERTS
    paths = [str(make_family_model(tmp_path / f"{i}-{family}", family, **kw))
             for i, (family, kw) in enumerate(cases)]
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), port, json.dumps(paths)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    ranks = [[json.loads(line) for line in out.splitlines()] for out, _ in outs]
    assert len(ranks[0]) == len(ranks[1]) == 2 * len(cases)
    for i, (a, b) in enumerate(zip(*ranks)):
        case, gather = cases[i // 2], i % 2 == 1
        assert a["bits"] == b["bits"], case   # both ranks leave with the same logits
        if gather and case not in SUMMED_EXPERTS:
            # Every value computed as on one rank: the same bits.
            assert a["equal"], (case, a)
        else:
            # The partial products are summed in another order than one rank's
            # kernel sums them: equal to rounding.
            assert a["error"] < 1e-5, (case, a)
            assert a["same_argmax"], case


# Each rank loads models as the engine does (the CPU backend, int8 activations), runs
# the decoder-stack test's steps (prefill, decode, a chunk beside a decode) through the
# fused stack and the module path, and prints digests of the hidden states; rank 0
# also runs one unsharded rank of the same files.
CPU_RANK = textwrap.dedent("""
    import hashlib, json, sys
    import mlx.core as mx
    import numpy as np
    import torch.distributed as dist
    from tests.cpu.test_decoder_stack import STEPS, _run, module_path
    from vllm_metal.cpu.backend import CpuBackend
    from vllm_metal.distributed.group import join_mlx_group
    from vllm_metal.distributed.tensor import TensorShard
    from vllm_metal.v1.model_lifecycle import load_model

    rank, port, paths = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    digest = lambda outs: hashlib.sha1(b"".join(np.asarray(o).tobytes() for o in outs)).hexdigest()
    def run(loaded):
        return {"stack": loaded.backbone.stack is not None,
                "stack_bits": digest(_run(loaded, STEPS, seed=3)[0]),
                "module_bits": digest(_run(module_path(loaded), STEPS, seed=3)[0])}
    ones = [run(load_model(p, mx.float32, CpuBackend())) for p in paths] if rank == 0 else []
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    group = join_mlx_group(dist.group.WORLD, rank, 2, same_host=True)
    shards = [run(load_model(p, mx.float32, CpuBackend(),
                             tensor=TensorShard(rank, 2, group, gather=True))) for p in paths]
    print(json.dumps({"one": ones, "shards": shards}))
""")

# Uneven heads (SmolLM2's 9 over 3 KV heads), q/k norms, Gemma's norms, window and
# GELU, one KV head shared by both ranks, MLP columns that split unevenly (384 and
# 416: the first rank pads phantom columns); all with int8 activations.
GATHERED = [("llama", dict(num_attention_heads=9, num_key_value_heads=3, hidden_size=288,
                           quantize_bits=4, group_size=32)),
            ("qwen3", dict(quantize_bits=8, group_size=64)),
            ("gemma3_text", dict(quantize_bits=4, group_size=32)),
            ("llama", dict(num_key_value_heads=1, quantize_bits=4, group_size=64)),
            ("llama", dict(intermediate_size=800, quantize_bits=4, group_size=32))]


def test_two_gathering_ranks_compute_one_ranks_bits_on_the_cpu_kernels(tmp_path):
    paths = [str(make_family_model(tmp_path / f"{i}-{family}", family, **kw))
             for i, (family, kw) in enumerate(GATHERED)]
    port = str(_free_port())
    env = {**os.environ, "VLLM_METAL_CPU_INT8_ACTIVATIONS": "1"}
    root = Path(__file__).resolve().parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", CPU_RANK, str(r), port, json.dumps(paths)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=root)
             for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    got = [json.loads(out.splitlines()[-1]) for out, _ in outs]
    ones = got[0]["one"]
    for case, one, a, b in zip(GATHERED, ones, got[0]["shards"], got[1]["shards"]):
        assert one["stack"] and a["stack"] and b["stack"], case   # the fused stack ran
        for path in ("stack_bits", "module_bits"):
            assert a[path] == b[path] == one[path], (case, path)
