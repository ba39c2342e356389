"""Where a Gated DeltaNet layer's per-request state lives inside vLLM's KV pages.

vLLM's hybrid cache manager gives a linear-attention layer one page per state
(its MambaSpec) out of a KVCacheTensor it shares with one attention layer of
another group: a block id belongs to one group at a time, so the bytes of block
``b`` hold either K/V rows or a state. The paged cache keeps each tensor as a K
and a V array [num_blocks, block_size, kv_heads, head_dim]; seen as float32,
block ``b`` of each is a row of ``half_floats`` floats, ``lo`` (K) and ``hi`` (V).

A state is placed in those two rows so that no piece straddles them:
- ``lo[b, 0 : conv_floats]``: the short convs' last K - 1 inputs, each [K - 1, C_i]
  after the ones before it (most mixers have one conv over q, k and v together;
  some have one each);
- ``lo[b, ssm_offset + h * head_floats ...]`` for heads h < heads_in_lo, then
  ``hi[b, (h - heads_in_lo) * head_floats ...]`` for the rest: each value head's
  recurrent state [Dv, Dk], row-major.
All float32: mlx-lm keeps the recurrent state in float32, and a conv state of
float16/bfloat16 inputs is exact in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

# The recurrent states start on a 64-byte boundary (a cache line, a SIMD row).
_ALIGN_FLOATS = 16


@dataclass(frozen=True)
class GdnStateShape:
    """One GDN layer's state: short convs of K taps over C_i channels (conv_dims; one
    conv over C = 2 * Hk * Dk + Hv * Dv for Qwen3-Next), then Hv heads of [Dv, Dk]
    (none for a layer of short convolutions only, as LFM2's). A Mamba2 mixer's state
    is the same shape (Dv the head size, Dk the SSM state size), updated by the
    linear rule instead of the delta rule (delta_rule False)."""

    conv_kernel: int
    conv_dims: tuple[int, ...]
    num_v_heads: int
    head_v_dim: int
    head_k_dim: int
    delta_rule: bool = True

    @property
    def conv_dim(self) -> int:
        return sum(self.conv_dims)

    def conv_offset(self, index: int) -> int:
        """Where conv ``index``'s [K - 1, C_index] state starts in ``lo``."""
        return (self.conv_kernel - 1) * sum(self.conv_dims[:index])

    @property
    def conv_floats(self) -> int:
        return (self.conv_kernel - 1) * self.conv_dim

    @property
    def ssm_offset(self) -> int:
        return -(-self.conv_floats // _ALIGN_FLOATS) * _ALIGN_FLOATS

    @property
    def head_floats(self) -> int:
        return self.head_v_dim * self.head_k_dim

    @property
    def nbytes(self) -> int:
        """What vLLM's MambaSpec counts: conv + recurrent state, float32."""
        return 4 * (self.conv_floats + self.num_v_heads * self.head_floats)

    def heads_in_lo(self, half_floats: int) -> int:
        if not self.num_v_heads:   # short convolutions only
            return 0
        return max(0, min(self.num_v_heads, (half_floats - self.ssm_offset) // self.head_floats))

    def fits(self, half_floats: int) -> bool:
        """Whether the state fits two rows of ``half_floats`` floats as placed above."""
        if half_floats < self.conv_floats:
            return False
        rest = self.num_v_heads - self.heads_in_lo(half_floats)
        return rest * self.head_floats <= half_floats


def half_page_floats(block_size: int, num_kv_heads: int, head_dim: int, dtype_size: int) -> int:
    """Floats in one block of a K (or V) array: the room of ``lo`` (or ``hi``)."""
    return block_size * num_kv_heads * head_dim * dtype_size // 4


def block_size_for_states(states: list[GdnStateShape], num_kv_heads: int, head_dim: int,
                          dtype_size: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` tokens whose K and V blocks hold every
    state as placed above (vLLM pads each state page to the attention page)."""
    per_token_bytes = num_kv_heads * head_dim * dtype_size
    if (per_token_bytes * multiple) % 4:
        raise ValueError(f"a block of {multiple} tokens of {per_token_bytes} bytes is not a "
                         "whole number of float32 words")
    need = max(s.nbytes for s in states)
    # Start from the plain size bound, then step until the placement fits too.
    blocks = max(1, -(-need // (2 * per_token_bytes * multiple)))
    while not all(s.fits(half_page_floats(blocks * multiple, num_kv_heads, head_dim,
                                          dtype_size)) for s in states):
        blocks += 1
    return blocks * multiple
