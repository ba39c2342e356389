"""vllm_metal.models.whisper against transformers' own float32 Whisper on a tiny random
checkpoint: the encoder's rows, and the decoder's logits over a packed paged step of
two requests' prompts followed by decode steps (self-attention pages, and the cross
pages written once in the first step), with and without the CPU key columns."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from tests.speech_models import cached_whisper_model, reference_model
from vllm_metal.attention.context import AttentionMetadata, ForwardContext
from vllm_metal.models.whisper import CrossStep, load_whisper

BLOCK = 16


@pytest.fixture(scope="module")
def path():
    return cached_whisper_model()


@pytest.fixture(scope="module")
def reference(path):
    return reference_model(path)


@pytest.fixture(scope="module")
def model(path):
    return load_whisper(path, mx.float32)


def _features(seed: int, c) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 1.0, (c.num_mel_bins, 2 * c.max_source_positions)).astype(np.float32)


def test_encoder_matches_transformers(model, reference):
    import torch

    feats = _features(1, model.config)
    got = np.array(model.encoder(mx.array(feats)))
    with torch.no_grad():
        want = reference.model.encoder(torch.from_numpy(feats)[None]).last_hidden_state[0]
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), atol=2e-4, rtol=2e-4)


class _Pages:
    """Self and cross pages of two requests, as vLLM's two KV cache groups would hold
    them (self group 0, cross group 1)."""

    def __init__(self, c, key_columns: bool) -> None:
        heads, hd = c.decoder_heads, c.head_dim
        blocks = 32
        shape = ((blocks, heads, hd, BLOCK) if key_columns else (blocks, BLOCK, heads, hd))
        n = c.decoder_layers
        self.keys = [mx.zeros(shape) for _ in range(2 * n)]
        self.values = [mx.zeros((blocks, BLOCK, heads, hd)) for _ in range(2 * n)]
        self.groups = [0] * n + [1] * n
        self.key_columns = key_columns
        self.self_tables = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
        per = -(-c.max_source_positions // BLOCK)
        self.cross_tables = np.array([list(range(10, 10 + per)),
                                      list(range(20, 20 + per))], np.int32)
        self.enc_len = c.max_source_positions

    def step(self, model, ids: list[list[int]], starts: list[int], encoded) -> mx.array:
        """One packed step: request i's tokens ids[i] at positions starts[i]...; encoded:
        None or the two requests' encoder rows (the first step)."""
        lens = [len(t) for t in ids]
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens)])
        req = np.repeat(np.arange(len(ids)), lens)
        slots = self.self_tables[req, positions // BLOCK] * BLOCK + positions % BLOCK
        meta = AttentionMetadata(
            positions=mx.array(positions.astype(np.int32)),
            cu_seqlens_q=mx.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)),
            seq_lens=mx.array(np.array([s + n for s, n in zip(starts, lens)], np.int32)),
            block_tables=[mx.array(self.self_tables), mx.array(self.cross_tables)],
            slot_mapping=[mx.array(slots.astype(np.int32)), mx.array(slots.astype(np.int32))])
        ctx = ForwardContext(meta, self.keys, self.values, self.groups,
                             key_columns=self.key_columns)
        cross = CrossStep(tables=mx.array(self.cross_tables[req]),
                          lens=mx.full((len(req),), self.enc_len, dtype=mx.int32))
        if encoded is not None:
            at = np.arange(self.enc_len)
            cross.encoded = mx.concatenate(encoded)
            cross.slots = mx.array(np.concatenate(
                [t[at // BLOCK] * BLOCK + at % BLOCK for t in self.cross_tables]).astype(np.int32))
        hidden = model.decoder(mx.array(np.concatenate(ids).astype(np.int32)),
                               meta.positions, ctx, cross)
        logits = model.decoder.logits(hidden)
        mx.eval(logits, *self.keys, *self.values)
        return np.array(logits)


def _reference_logits(reference, feats: np.ndarray, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = reference(input_features=torch.from_numpy(feats)[None],
                        decoder_input_ids=torch.tensor([ids]))
    return out.logits[0].numpy()


@pytest.mark.parametrize("key_columns", [False, True])
def test_paged_decoder_matches_transformers(model, reference, key_columns):
    c = model.config
    feats = [_features(2, c), _features(3, c)]
    prompts = [[1, 50, 60, 70, 80], [1, 90, 100]]
    pages = _Pages(c, key_columns)
    encoded = [model.encoder(mx.array(f)) for f in feats]
    logits = pages.step(model, prompts, [0, 0], encoded)
    seqs = [list(p) for p in prompts]
    ends = np.cumsum([len(p) for p in prompts])
    rows = [logits[: ends[0]], logits[ends[0]: ends[1]]]
    for i in range(2):
        want = _reference_logits(reference, feats[i], seqs[i])
        np.testing.assert_allclose(rows[i], want, atol=2e-3, rtol=1e-3)
    # Decode: each request's greedy token, one row each; cross pages only read.
    for _ in range(4):
        nxt = [[int(r[-1].argmax())] for r in rows]
        starts = [len(s) for s in seqs]
        for s, t in zip(seqs, nxt):
            s.extend(t)
        logits = pages.step(model, nxt, starts, None)
        rows = [logits[0:1], logits[1:2]]
        for i in range(2):
            want = _reference_logits(reference, feats[i], seqs[i])[-1:]
            np.testing.assert_allclose(rows[i], want, atol=2e-3, rtol=1e-3)
