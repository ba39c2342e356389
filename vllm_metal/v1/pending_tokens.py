"""Sampled tokens still on the device: the one-step-ahead decode pipeline's bookkeeping.

``sample_tokens`` appends a placeholder per sampled request and starts the
step's evaluation without waiting; the next ``execute_model`` reads the
placeholders' values from the device array inside its graph; ``resolve``
writes the real ids into the host state when vLLM asks for the output.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from vllm_metal.v1.input_batch import InputBatch, StepInputs

PLACEHOLDER = -1


@dataclass(eq=False)  # identity semantics: steps hold device arrays
class InflightStep:
    """One step's sampled ids, not yet read back.

    sampled:  int32 [num_sampling] (device)
    req_ids:  the sampling requests, in row order
    slots:    per request, the index of its placeholder in output_token_ids
    """

    sampled: mx.array
    req_ids: list[str]
    slots: list[int]
    host: np.ndarray | None = None

    def wait(self) -> np.ndarray:
        if self.host is None:
            self.host = np.array(self.sampled, copy=False).astype(np.int64)
        return self.host


class PendingTokens:
    def __init__(self, batch: InputBatch) -> None:
        self.batch = batch
        # vLLM's multiprocessing executor reads a step's output (resolve) on a thread of
        # its own while the runner builds the next step from the same host state: the
        # runner holds this lock over each step's host work, resolve takes it.
        self.lock = threading.RLock()
        self._inflight: list[InflightStep] = []
        # req_id -> (step, row in that step's sampled array)
        self._where: dict[str, tuple[InflightStep, int]] = {}

    def add(self, sampled: mx.array, req_ids: list[str]) -> InflightStep:
        """Append a placeholder token for each request; ``sampled`` fills them later."""
        slots = []
        for req_id in req_ids:
            slots.append(len(self.batch.requests[req_id].output_token_ids))
            self.batch.append_token(req_id, PLACEHOLDER)
        step = InflightStep(sampled, list(req_ids), slots)
        self._inflight.append(step)
        for row, req_id in enumerate(req_ids):
            self._where[req_id] = (step, row)
        return step

    def resolve(self, step: InflightStep) -> np.ndarray:
        """Wait for ``step`` and write its tokens into the host state. Returns the ids."""
        tokens = step.wait()   # unlocked: the runner builds the next step meanwhile
        with self.lock:
            self._write(step, tokens)
        return tokens

    def _write(self, step: InflightStep, tokens: np.ndarray) -> None:
        if step not in self._inflight:
            return
        for req_id, slot, token in zip(step.req_ids, step.slots, tokens.tolist()):
            if self._where.get(req_id, (None,))[0] is step:
                del self._where[req_id]
            state = self.batch.requests.get(req_id)
            if state is None or slot >= len(state.output_token_ids):
                continue  # finished or truncated by the scheduler meanwhile
            state.output_token_ids[slot] = token
            self.batch.set_token(req_id, len(state.prompt_token_ids) + slot, token)
        self._inflight.remove(step)

    def resolve_all(self) -> None:
        for step in list(self._inflight):
            self.resolve(step)

    def forget(self, req_id: str) -> None:
        self._where.pop(req_id, None)

    @property
    def any(self) -> bool:
        return bool(self._where)

    def resolve_stale(self) -> None:
        """Read back every in-flight step but the newest (only it may feed the next forward)."""
        for step in self._inflight[:-1]:
            self.resolve(step)

    def placeholders(self, step: StepInputs) -> tuple[list[int], list[int]]:
        """Where the newest step's placeholders sit in ``step``: packed token positions,
        and for each the row of the newest step's sampled array that fills it."""
        positions, rows = [], []
        newest = self._inflight[-1] if self._inflight else None
        for i, req_id in enumerate(step.req_ids):
            found = self._where.get(req_id)
            if found is None:
                continue
            inflight, row = found
            assert inflight is newest, "resolve_stale() must run before prepare_inputs()"
            pos = len(self.batch.requests[req_id].prompt_token_ids) + inflight.slots[row]
            start, end = int(step.cu_seqlens_q[i]), int(step.cu_seqlens_q[i + 1])
            offset = pos - int(step.positions[start])
            if 0 <= offset < end - start:
                positions.append(start + offset)
                rows.append(row)
        return positions, rows

    def fill_inputs(self, step: StepInputs) -> mx.array:
        """input_ids int32 [total_q] with the newest step's device values in place of
        its placeholders (call ``resolve_stale`` before building ``step``)."""
        if not self._where:
            return mx.array(step.input_ids)
        newest = self._inflight[-1]
        positions, rows = self.placeholders(step)
        if covers_step(positions, rows, len(step.input_ids), len(newest.req_ids)):
            return newest.sampled.astype(mx.int32)  # steady decode: no gather/scatter nodes
        input_ids = mx.array(step.input_ids)
        if positions:
            values = newest.sampled[mx.array(np.asarray(rows, dtype=np.int32))]
            input_ids[mx.array(np.asarray(positions, dtype=np.int32))] = values.astype(mx.int32)
        return input_ids


def covers_step(positions: list[int], rows: list[int], total_q: int, num_sampled: int) -> bool:
    """True when every token of a step is a placeholder and token i takes sampled row i:
    the sampled array is then the step's input ids as it is."""
    return total_q == num_sampled == len(positions) and positions == rows == list(range(total_q))
