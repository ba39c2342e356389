"""A pipeline stage: the run of decoder layers one rank holds, and the stand-ins that
take the other layers' places.

The family's own backbone code runs unchanged on every rank: it still embeds, walks
every layer by its index (sliding-window patterns and hybrid layer kinds are read by
index) and normalises. A layer another stage runs is a pass-through that holds no
weights; the one just before this stage's first layer replaces the hidden state with
what the previous stage sent, and the one just after its last layer records the
hidden state to send on. Cut before the weights are evaluated, so a rank never loads
another stage's layers (mlx-lm loads lazily).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn


@dataclass(frozen=True)
class PipelineStage:
    rank: int    # this stage, in [0, size)
    size: int
    start: int   # its first layer
    end: int     # one past its last

    @classmethod
    def of(cls, num_layers: int, rank: int, size: int) -> PipelineStage:
        """Stage ``rank`` of ``size`` over ``num_layers`` layers, split as vLLM splits
        them (VLLM_PP_LAYER_PARTITION, else evenly, the remainder on the stages
        before the last)."""
        from vllm.distributed.utils import get_pp_indices

        if not 0 <= rank < size:
            raise ValueError(f"pipeline rank {rank} is outside [0, {size})")
        start, end = get_pp_indices(num_layers, rank, size)
        if end <= start:
            raise ValueError(
                f"--pipeline-parallel-size {size} leaves stage {rank} no layer of the "
                f"model's {num_layers}; use at most {num_layers} stages")
        return cls(rank, size, start, end)

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    def holds(self, layer: int) -> bool:
        return self.start <= layer < self.end


class StageLink:
    """A stage's two boundary tensors for the step being built: ``incoming`` [T, hidden]
    (what the previous stage sent; None in a forward that receives nothing, such as a
    memory profile, which then runs on the embedding's output) and ``outgoing``
    [..., hidden], T rows (the hidden state after this stage's last layer, set by
    the forward, in the backbone's batch layout); and, in an engine, the MLX group
    and the global ranks of the stages before and after (None at the ends). Hidden
    states travel as float32 (exact for the half types the stages compute in)."""

    def __init__(self, group=None, prev: int | None = None, next: int | None = None) -> None:
        self.group, self.prev, self.next = group, prev, next
        self.incoming: mx.array | None = None
        self.outgoing: mx.array | None = None

    def receive(self, rows: int, hidden: int) -> None:
        """Set ``incoming`` to the previous stage's [rows, hidden] of this step (lazy:
        read when the step is evaluated). MLX's transfers carry no tags, so every
        stage sends and receives its steps in the same order."""
        self.incoming = mx.distributed.recv((rows, hidden), mx.float32, self.prev,
                                            group=self.group)

    def send(self) -> None:
        """Evaluate this step through ``outgoing`` and send it to the next stage; then
        forget the step's tensors."""
        out = self.outgoing
        self.clear()
        if out is None:
            raise RuntimeError("the forward never reached the layer after this stage")
        rows = out.reshape(-1, out.shape[-1]).astype(mx.float32)
        mx.eval(mx.distributed.send(rows, self.next, group=self.group))

    def clear(self) -> None:
        self.incoming = self.outgoing = None


class _Elsewhere(nn.Module):
    """A layer another stage runs: passes the hidden state through and holds no
    weights. Keeps the layer's plain attributes (e.g. ``is_linear``,
    ``use_sliding``), which some backbones read to pick a layer's mask."""

    def __init__(self, layer: nn.Module, link: StageLink) -> None:
        super().__init__()
        for name, value in vars(layer).items():
            if not name.startswith("_") and not isinstance(value, (mx.array, nn.Module)):
                setattr(self, name, value)
        self._link = link

    def __call__(self, h: mx.array, *args, **kwargs) -> mx.array:
        return h


class _Entering(_Elsewhere):
    """The layer just before this stage: its output is what the previous stage sent."""

    def __call__(self, h: mx.array, *args, **kwargs) -> mx.array:
        got = self._link.incoming
        return h if got is None else got.astype(h.dtype).reshape(h.shape)


class _Leaving(_Elsewhere):
    """The layer just after this stage: records the hidden state to send on."""

    def __call__(self, h: mx.array, *args, **kwargs) -> mx.array:
        self._link.outgoing = h
        return h


def link_of(layers: list) -> StageLink | None:
    """The StageLink cut_layers gave ``layers``' stand-ins (None: nothing was cut)."""
    for layer in layers:
        if isinstance(layer, _Elsewhere):
            return layer._link
    return None


def runs_elsewhere(layer: nn.Module) -> bool:
    """Whether ``layer`` is a stand-in for a layer another stage runs."""
    return isinstance(layer, _Elsewhere)


def cut_layers(layers: list, stage: PipelineStage, link: StageLink) -> None:
    """Replace, in place, every layer of ``layers`` that ``stage`` does not hold by its
    stand-in. ``layers`` is the backbone's own list, not a view of it (mlx-lm's
    ``pipeline_layers`` is a copy). Raises ValueError if the stage does not
    fit the list."""
    if not isinstance(layers, list):
        raise ValueError(f"the backbone keeps its layers in a {type(layers).__name__}, "
                         "not a list; pipeline stages cut a list")
    if stage.end > len(layers):
        raise ValueError(f"stage {stage.rank} holds layers [{stage.start}, {stage.end}) of a "
                         f"model with {len(layers)}")
    for i, layer in enumerate(layers):
        if stage.holds(i):
            continue
        kind = (_Entering if i == stage.start - 1 else _Leaving if i == stage.end
                else _Elsewhere)
        layers[i] = kind(layer, link)
