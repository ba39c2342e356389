"""The runner's multimodal encoder outputs: encoded once per item, sliced into steps.

vLLM's scheduler decides which items (``MultiModalFeatureSpec``) a step encodes
(``scheduled_encoder_inputs``) and when an output may go
(``free_encoder_mm_hashes``); its encoder-cache budget counts the embeddings kept
here. A prompt chunk may start or end inside an item's placeholder span: the
chunk takes the rows of the item's output that its own span rows stand for,
as vLLM's GPU runner gathers them, so a span split across steps is merged
exactly as a whole one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

if TYPE_CHECKING:
    from vllm.multimodal.inputs import MultiModalFeatureSpec
    from vllm.v1.core.sched.output import SchedulerOutput

    from vllm_metal.models.vision import VisionTower
    from vllm_metal.v1.input_batch import StepInputs

logger = logging.getLogger("vllm_metal")
_warned_split = False


def _warn_split(req_id: str) -> None:
    # vLLM keeps an image whole in one step for these models (disable_chunked_mm_input)
    # unless a prefix hit ends inside it and the step's budget then cuts the rest; the
    # rows computed before the rest arrives see only the keys so far (vLLM's GPU
    # runner does the same).
    global _warned_split
    if _warned_split:
        return
    _warned_split = True
    logger.warning("request %s: an image that attends bidirectionally is split across "
                   "steps after a prefix hit; its first rows do not see the rest of it",
                   req_id)


class EncoderCache:
    """Encoder outputs by item identifier, and each live request's items."""

    def __init__(self, tower: VisionTower) -> None:
        self.tower = tower
        self.outputs: dict[str, mx.array] = {}      # identifier -> [num_embeds, hidden]
        self.features: dict[str, list[MultiModalFeatureSpec]] = {}   # req_id -> its items

    def update(self, out: SchedulerOutput) -> None:
        """Follow the step's requests and encode its scheduled items (before the
        forward that reads them)."""
        for identifier in out.free_encoder_mm_hashes:
            self.outputs.pop(identifier, None)
        for req_id in out.finished_req_ids:
            self.features.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            if new.mm_features:
                self.features[new.req_id] = list(new.mm_features)
        self._encode(out.scheduled_encoder_inputs)

    def _encode(self, scheduled: dict[str, list[int]]) -> None:
        todo: dict[str, MultiModalFeatureSpec] = {}
        for req_id, indices in scheduled.items():
            for i in indices:
                feature = self.features[req_id][i]
                if feature.data is None or feature.identifier in self.outputs:
                    continue   # covered by a prefix hit, or encoded already
                if feature.modality != self.tower.modality:
                    raise ValueError(f"request {req_id}: {feature.modality} inputs are not "
                                     "served by this model")
                todo.setdefault(feature.identifier, feature)
        if not todo:
            return
        encoded = self.tower.encode([f.data.get_data() for f in todo.values()])   # evaluated
        for (identifier, feature), rows in zip(todo.items(), encoded):
            expected = feature.mm_position.get_num_embeds()
            if rows.shape[0] != expected:
                raise RuntimeError(f"item {identifier}: the encoder gave {rows.shape[0]} rows "
                                   f"for {expected} placeholder embeddings")
            self.outputs[identifier] = rows

    def _in_step(self, step: StepInputs) -> Iterator[tuple[str, int, int, int, Any]]:
        """(req_id, first packed row, first position, one past the last position,
        item) for each item whose placeholder span meets the request's rows this step."""
        for i, req_id in enumerate(step.req_ids):
            features = self.features.get(req_id)
            first, last = int(step.cu_seqlens_q[i]), int(step.cu_seqlens_q[i + 1])
            if not features or last == first:
                continue
            computed = int(step.positions[first])
            stop = computed + last - first
            for feature in features:
                pos = feature.mm_position
                if pos.offset >= stop:
                    break   # sorted by offset: the rest start later
                if pos.offset + pos.length > computed:
                    yield req_id, first, computed, stop, feature

    def key_ends(self, step: StepInputs, longest: int | None) -> np.ndarray | None:
        """int32 [total_q]: for each row inside an image's embedding span, one past
        the span's last position (its attention sees the whole image: a prefix-LM's,
        as vLLM's ``compute_mm_prefix_ranges``); 0 elsewhere; None when no row is.
        Spans longer than ``longest`` (the model's sliding window) stay causal, as
        vLLM leaves them."""
        ends = None
        for req_id, first, computed, stop, feature in self._in_step(step):
            for lo, hi in feature.mm_position.extract_embeds_range():
                if longest is not None and hi - lo + 1 > longest:
                    continue
                a, b = max(lo, computed), min(hi + 1, stop)
                if a < b:
                    if hi + 1 > stop:
                        _warn_split(req_id)
                    if ends is None:
                        ends = np.zeros(len(step.input_ids), np.int32)
                    ends[first + a - computed:first + b - computed] = hi + 1
        return ends

    def gather(self, step: StepInputs) -> tuple[np.ndarray, mx.array] | None:
        """(packed rows int32 [n], their embeddings [n, hidden]) of the step's
        placeholder rows that take an encoder output; None when it has none."""
        rows: list[np.ndarray] = []
        parts: list[mx.array] = []
        for req_id, first, computed, stop, feature in self._in_step(step):
            pos = feature.mm_position
            start = max(computed - pos.offset, 0)
            end = min(stop - pos.offset, pos.length)
            output = self.outputs.get(feature.identifier)
            if output is None:
                raise RuntimeError(f"request {req_id}: item {feature.identifier} was not "
                                   "encoded before the step that reads it")
            lo, hi = pos.get_embeds_indices_in_range(start, end)
            span = np.arange(start, end)
            if pos.is_embed is not None:
                span = span[pos.is_embed[start:end].numpy()]
            if hi > lo:
                rows.append(first + pos.offset - computed + span)
                parts.append(output[lo:hi])
        if not rows:
            return None
        return np.concatenate(rows).astype(np.int32), mx.concatenate(parts)
