"""StateCache: what an mlx-lm model holds as a Gated DeltaNet or Mamba2 layer's
cache in a paged forward.

mlx-lm's GDN mixers (qwen3_next, qwen3_5, and the families that share their
``gated_delta_update``) and Mamba2 mixers (nemotron_h, granitemoehybrid, ... : the
families that share ``ssm_update``) keep an ``ArraysCache``: first the short convs'
last inputs (one slot per conv), then the recurrent state, for a batch whose rows
are whole sequences.
Here the rows are ``total_q`` single tokens of several requests, and each
request's state lives in its KV page (attention/caches/state_pages.py). So:
- a conv slot is None: the mixer pads each row with zeros of the conv's width, and
  the conv module (a PagedShortConv) takes only the row's own input, continuing
  its request's conv from the page;
- the last slot is a StateRef: mlx-lm's ``gated_delta_update`` and ``ssm_update``
  (switched to paged_gated_delta_update and paged_ssm_update) see it and run the
  packed recurrence over the pages (a Mamba2 SSM is the gated rule without the
  delta term: ops.gdn.gated_delta with delta=False);
- what the mixer stores back (``cache[i] = ...``) is dropped: the ops wrote it.
The family's own projections, norms, gates and head splits run unmodified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.attention.context import get_forward_context
from vllm_metal.attention.layer_cache import rebind_in_mlx_lm


@dataclass(frozen=True)
class StateRef:
    """The recurrent state of state entry ``entry``, in the paged cache."""

    entry: int


class StateCache:
    """State entry ``entry`` of the model (an mlx-lm ArraysCache of ``size`` slots, the
    last a recurrent state when ``recurrent``, else conv inputs only: LFM2's short
    convolution layers)."""

    lengths = None        # mlx-lm's batch-generation padding: none here
    left_padding = None

    def __init__(self, entry: int, size: int, recurrent: bool = True) -> None:
        self.entry = entry
        self.size = size
        self.recurrent = recurrent

    def __getitem__(self, index: int) -> StateRef | None:
        if not -self.size <= index < self.size:
            raise IndexError(index)
        last = index % self.size == self.size - 1
        return StateRef(self.entry) if self.recurrent and last else None

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        return (self[i] for i in range(self.size))

    def __setitem__(self, index: int, value: Any) -> None:
        pass

    def __bool__(self) -> bool:
        return True

    def advance(self, n: int) -> None:
        pass

    def make_mask(self, n: int, **_: Any) -> None:
        return None


class PagedShortConv(nn.Module):
    """Conv ``index`` of a GDN mixer: its depthwise ``nn.Conv1d`` over [rows, K, C]
    inputs whose first K - 1 positions are the zeros StateCache lets the mixer pad
    with: each row's own input (the last position) continues its request's conv
    from the page. Outside a paged forward it is the family's conv."""

    def __init__(self, entry: int, index: int, conv: nn.Conv1d) -> None:
        super().__init__()
        self.entry = entry
        self.index = index
        self.conv = conv

    def __call__(self, x: mx.array) -> mx.array:
        from vllm_metal.attention.context import in_forward

        if not in_forward():
            return self.conv(x)
        weight = self.conv.weight       # [C, K, 1]
        if x.ndim != 3 or x.shape[1] != weight.shape[1] or weight.shape[2] != 1:
            raise ValueError(
                f"state entry {self.entry}: conv input {tuple(x.shape)} with weight "
                f"{tuple(weight.shape)} is not a depthwise conv over one new token per row")
        y = get_forward_context().short_conv(self.entry, self.index, x[:, -1, :],
                                             weight[:, :, 0])
        if "bias" in self.conv:
            y = y + self.conv.bias
        return y[:, None, :]


def paged_gated_delta_update(q: mx.array, k: mx.array, v: mx.array, a: mx.array, b: mx.array,
                             A_log: mx.array, dt_bias: mx.array,  # noqa: N803 (mlx-lm's names)
                             state: Any = None, mask: mx.array | None = None, *,
                             use_kernel: bool = True, lower_bound: float | None = None,
                             allow_neg_eigval: bool = False) -> tuple[mx.array, Any]:
    """mlx-lm's ``gated_delta_update``, paged when the state is a StateRef: beta and
    the decay g are computed by mlx-lm's own functions, then the recurrence runs over
    the packed rows of the step, from and into each request's page. q, k [rows, 1, Hk,
    Dk], v [rows, 1, Hv, Dv], a, b [rows, 1, Hv] -> (y [rows, 1, Hv, Dv], the StateRef)."""
    if not isinstance(state, StateRef):
        return _MLX_UPDATE(q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel,
                           lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval)
    from mlx_lm.models import gated_delta

    if mask is not None:
        raise ValueError(f"state entry {state.entry}: the mixer passed a mask of its own")
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    if lower_bound is None:
        g = gated_delta.compute_g(A_log, a, dt_bias)
    else:
        g = gated_delta.compute_lower_bound_g(A_log, a, dt_bias, lower_bound)
    y = get_forward_context().gated_delta(state.entry, q[:, 0], k[:, 0], v[:, 0], g[:, 0],
                                          beta[:, 0])
    return y[:, None], state


def _mlx_update():
    from mlx_lm.models import gated_delta

    return gated_delta.gated_delta_update


_MLX_UPDATE = _mlx_update()


def paged_ssm_update(hidden_states: mx.array, A_log: mx.array, B: mx.array,  # noqa: N803
                     C: mx.array, D: mx.array, dt: mx.array, dt_bias: mx.array,  # noqa: N803
                     state: Any = None, time_step_limit: tuple[float, float] = (0.001, 100.0),
                     mask: mx.array | None = None,
                     lengths: mx.array | None = None) -> tuple[mx.array, Any]:
    """mlx-lm's ``ssm_update`` (a Mamba2 SSM), paged when the state is a StateRef:
    per head, S = exp(dt A) S + dt outer(x, B); y = S C + D x, with dt from mlx-lm's
    own ``compute_dt``: the linear gated rule with q = C, k = B, v = x, g = exp(dt A),
    beta = dt. hidden_states [rows, 1, H, Dh], B, C [rows, 1, G, N], dt [rows, 1, H]
    -> (y [rows, 1, H, Dh], the StateRef)."""
    if not isinstance(state, StateRef):
        return _MLX_SSM(hidden_states, A_log, B, C, D, dt, dt_bias, state, time_step_limit,
                        mask, lengths)
    from mlx_lm.models import ssm

    if mask is not None or lengths is not None:
        raise ValueError(f"state entry {state.entry}: the mixer passed a mask of its own")
    x = hidden_states[:, 0]
    dt = ssm.compute_dt(dt, dt_bias, time_step_limit)[:, 0]         # [rows, H] float32
    g = mx.exp(dt * -mx.exp(A_log.astype(mx.float32)))
    y = get_forward_context().gated_delta(state.entry, C[:, 0], B[:, 0], x, g, dt,
                                          delta=False)
    y = y.astype(x.dtype) + x * D[:, None]
    return y[:, None], state


def _mlx_ssm():
    from mlx_lm.models import ssm

    return ssm.ssm_update


_MLX_SSM = _mlx_ssm()


def install_paged_gated_delta() -> int:
    """mlx-lm's ``gated_delta_update`` -> paged_gated_delta_update and ``ssm_update`` ->
    paged_ssm_update (rebind_in_mlx_lm)."""
    return (rebind_in_mlx_lm("gated_delta_update", _MLX_UPDATE, paged_gated_delta_update)
            + rebind_in_mlx_lm("ssm_update", _MLX_SSM, paged_ssm_update))
