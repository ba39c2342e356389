"""The ranks on one host share its cores (data-parallel engines and tensor ranks each
get their own) and its memory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_metal.distributed.host_share import cores_of, host_share, remember_engines


@pytest.mark.parametrize("cores,ranks", [(2, 2), (8, 3), (16, 4), (2, 3), (1, 2), (6, 1)])
def test_each_rank_gets_its_own_cores_where_there_are_enough(cores, ranks):
    ids = list(range(10, 10 + cores))  # ids need not start at 0
    shares = [cores_of(r, ranks, ids) for r in range(ranks)]
    if cores >= ranks:
        assert sorted(c for s in shares for c in s) == ids        # disjoint, all used
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    else:
        assert all(len(s) == 1 and s[0] in ids for s in shares)   # shared round-robin


def _config(dp=1, dp_local=None, tp=1, pp=1, nnodes=1, dp_rank_local=None):
    parallel = SimpleNamespace(data_parallel_size=dp, data_parallel_size_local=dp_local or dp,
                               world_size=tp * pp, nnodes=nnodes,
                               data_parallel_rank_local=dp_rank_local)
    return SimpleNamespace(parallel_config=parallel, additional_config={})


def test_data_parallel_engines_are_remembered_before_vllm_makes_each_dp_1():
    config = _config(dp=3)
    remember_engines(config)
    # vLLM then gives each dense engine a data-parallel size of 1.
    config.parallel_config.data_parallel_size = config.parallel_config.data_parallel_size_local = 1
    remember_engines(config)
    shares = []
    for engine in range(3):
        config.parallel_config.data_parallel_rank_local = engine
        shares.append(host_share(config, 0))
    assert shares == [(0, 3), (1, 3), (2, 3)]


def test_tensor_ranks_and_nodes():
    assert [host_share(_config(tp=2), r) for r in range(2)] == [(0, 2), (1, 2)]
    # Four ranks over two nodes: two on this one.
    assert host_share(_config(tp=4, nnodes=2), 1) == (1, 2)
    assert host_share(_config(), 0) == (0, 1)
