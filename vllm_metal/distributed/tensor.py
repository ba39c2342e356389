"""Tensor parallel: each rank holds a slice of every layer's attention heads and MLP
columns, the way mlx.nn's ``shard_linear`` shards.

The projections into heads and MLP columns (q/k/v, gate/up) keep this rank's output
rows and need no communication (all-to-sharded). The projections out of them (o,
down) are made one of two ways, so every rank leaves each layer with the same hidden
state:

- sum: each keeps the input columns matching its heads / columns and all-sums its
  partial product over the group (sharded-to-all). Each rank holds 1/N of every
  layer; the sum adds the partial products in another order than one rank's kernel
  does, so the hidden states equal one rank's to rounding.
- gather: each keeps the whole projection and runs it on every rank's slice of its
  input, all-gathered (GatheredToAll). Every value is then computed by the same
  arithmetic as on one rank: a rank's output rows of a projection, its heads'
  attention and its MLP columns do not depend on the rows, heads and columns beside
  them in the CPU backend's kernels (tested; with int8 activations too: each whole
  input row is quantized; Metal's are not verified). Greedy
  tokens are one rank's, bit for bit; the two output projections (about a third of a
  llama layer's weights) are held whole on every rank.

A mixture-of-experts block (SummedBlock) keeps each expert's slice of its columns
and all-sums the block's partial output, gathering or not; its router stays whole,
so every rank routes a token to the same experts.

Embeddings, norms and the head stay whole on every rank, and every rank samples the
same tokens from the same logits.

Heads are split by KV group, so a rank's query heads attend its own KV heads. Where
the heads do not divide evenly (SmolLM2-135M: 9 query heads over 3 KV heads on 2
ranks) the ranks holding fewer are padded with phantom heads of zero weights, so
every rank declares the same KV cache shape (vLLM requires one spec per layer
across tensor ranks); a phantom head's output is cut off before the output
projection. With fewer KV heads than ranks, each KV head is held by the ranks that
share its query group.

The shard is made on the lazily loaded model, before any weight is evaluated: a rank
keeps only its slices (mlx-lm's load reads a tensor whole and the slice frees the
rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

# Attribute names families keep their head counts under (mlx-lm's attention modules).
_QUERY_HEADS = ("n_heads", "num_heads", "num_attention_heads")
_KV_HEADS = ("n_kv_heads", "num_kv_heads", "num_key_value_heads")
_ATTENTION_NAMES = ("self_attn", "attention", "attn")
# An attention module's output projection, by family naming (phi: dense).
_OUT_NAMES = ("o_proj", "dense", "out_proj")
_MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe")
# A mixture-of-experts block's experts (mlx-lm's SwitchGLU) and its shared expert.
_EXPERTS_NAMES = ("switch_mlp", "experts")
_SHARED_NAMES = ("shared_expert", "shared_experts")
# An MLP's projections (into its columns, out of them), by family naming.
_MLP_SHAPES = ((("gate_proj", "up_proj"), "down_proj"), (("gate_up_proj",), "down_proj"),
               (("up_proj",), "down_proj"), (("fc1",), "fc2"), (("c_fc",), "c_proj"),
               (("w1", "w3"), "w2"))
# Columns of x the int8 kernels quantize together: a slice of a sharded-to-all layer's
# input starts on such a boundary, so it is rounded as in the unsharded layer.
_INT8_GROUP = 32


class TensorParallelError(ValueError):
    """The model cannot be sharded over the tensor-parallel ranks; names what and why."""


@dataclass(frozen=True)
class HeadSplit:
    """One rank's heads: query heads [q_start, q_end) and KV heads [kv_start, kv_end) of
    the model's, laid out as q_local query heads over kv_local KV heads (the real ones
    first, then phantoms of zero weights)."""

    q_start: int
    q_end: int
    kv_start: int
    kv_end: int
    q_local: int
    kv_local: int

    @classmethod
    def of(cls, num_heads: int, num_kv_heads: int, rank: int, size: int) -> HeadSplit:
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise TensorParallelError(f"{num_heads} query heads do not group over "
                                      f"{num_kv_heads} KV heads")
        group = num_heads // num_kv_heads
        if num_kv_heads >= size:
            kv_start, kv_end = num_kv_heads * rank // size, num_kv_heads * (rank + 1) // size
            kv_local = -(-num_kv_heads // size)
            return cls(kv_start * group, kv_end * group, kv_start, kv_end,
                       kv_local * group, kv_local)
        if size % num_kv_heads:
            raise TensorParallelError(
                f"{num_kv_heads} KV heads cannot be shared evenly by {size} ranks; use a "
                f"--tensor-parallel-size that divides or is a multiple of {num_kv_heads}")
        sharers = size // num_kv_heads
        if group < sharers:
            raise TensorParallelError(
                f"{size} ranks leave some without a query head ({num_heads} query heads "
                f"over {num_kv_heads} KV heads); use at most {num_heads} ranks")
        head, part = divmod(rank, sharers)
        first = head * group
        return cls(first + group * part // sharers, first + group * (part + 1) // sharers,
                   head, head + 1, -(-group // sharers), 1)

    @property
    def q_real(self) -> int:
        return self.q_end - self.q_start

    @property
    def kv_real(self) -> int:
        return self.kv_end - self.kv_start


@dataclass(frozen=True)
class TensorShard:
    """This rank's place in the tensor-parallel group, the group it communicates over
    (None only in tests of a single rank's slices), and whether output projections
    gather their input (exact; ``gather``) or sum partial products."""

    rank: int
    size: int
    group: object | None = None
    gather: bool = False


class ShardedToAll(nn.Module):
    """A linear over this rank's slice of its input: x [..., >= width] -> [..., out],
    the partial product all-summed over the group, then the bias (added once).
    ``inner`` is the sliced linear itself (no bias), so the backend's fast kernels
    take it like any other; x's columns past ``width`` are phantom heads' and dropped."""

    def __init__(self, inner: nn.Module, bias: mx.array | None, width: int, group) -> None:
        super().__init__()
        self.inner = inner
        if bias is not None:
            self.bias = bias
        self.width = width
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        if x.shape[-1] != self.width:
            x = x[..., :self.width]
        y = self.inner(x)
        if self.group is not None:
            y = mx.distributed.all_sum(y, group=self.group)
        bias = self.get("bias")
        return y if bias is None else y + bias


class GatheredToAll(nn.Module):
    """A whole linear over all ranks' slices of its input: x [..., local] (this rank's
    heads or columns, phantoms included) -> all ranks' x gathered and laid out in the
    model's column order ``order`` [width] (indices into the ranks' concatenated
    slices) -> inner [..., out]. ``inner`` is the unsharded linear, bias included."""

    def __init__(self, inner: nn.Module, order: list[int], gathered: int, group) -> None:
        """``gathered``: the width of the ranks' slices concatenated."""
        super().__init__()
        self.inner = inner
        # "_": not a parameter. None: the slices are the columns in order (no phantoms).
        in_order = order == list(range(gathered))
        self._order = None if in_order else mx.array(order, dtype=mx.int32)
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        return self.inner(self.gather(x))

    def gather(self, x: mx.array) -> mx.array:
        """x [..., local] -> [..., width]: every rank's x, in the model's columns."""
        lead, local = x.shape[:-1], x.shape[-1]
        rows = x.reshape(-1, local)
        if self.group is not None:
            # all_gather stacks the ranks' rows: [N * rows, local] -> [rows, N * local]
            size = self.group.size()
            rows = mx.distributed.all_gather(rows, group=self.group)
            rows = rows.reshape(size, -1, local).transpose(1, 0, 2).reshape(-1, size * local)
        if self._order is not None:
            rows = mx.take(rows, self._order, axis=-1)
        return rows.reshape(*lead, rows.shape[-1])


class SummedBlock(nn.Module):
    """A mixture-of-experts block whose experts (and shared expert) hold this rank's
    slice of their columns: x -> the block's partial output, all-summed over the
    group. The router is whole, so every rank routes every token alike."""

    def __init__(self, block: nn.Module, group) -> None:
        super().__init__()
        self.block = block
        self.group = group

    def __call__(self, x: mx.array, *args, **kwargs) -> mx.array:
        y = self.block(x, *args, **kwargs)
        return y if self.group is None else mx.distributed.all_sum(y, group=self.group)


def shard_model(layers: list, shard: TensorShard,
                family: str) -> list[tuple[HeadSplit, int]]:
    """Shard every decoder layer in ``layers`` (the backbone's own list) for ``shard``,
    in place; returns each layer's (HeadSplit, head size). Raises TensorParallelError
    naming the layer and what it cannot shard."""
    return [shard_layer(i, layer, shard, family) for i, layer in enumerate(layers)]


def shard_layer(index: int, layer: nn.Module, shard: TensorShard,
                family: str) -> tuple[HeadSplit, int]:
    """shard_model for the decoder layer ``index`` alone."""
    where = f"{family}: layer {index}"
    attention = _child(layer, _ATTENTION_NAMES)
    if attention is None:
        raise TensorParallelError(f"{where} ({_qualname(layer)}) has no attention module "
                                  "vllm-metal can shard")
    split = _shard_attention(attention, shard, f"{where}'s attention")
    name = next((n for n in _MLP_NAMES if isinstance(getattr(layer, n, None), nn.Module)),
                None)
    if name is None:
        raise TensorParallelError(f"{where} ({_qualname(layer)}) has no MLP vllm-metal "
                                  "can shard")
    mlp = getattr(layer, name)
    experts = _experts(mlp)
    if experts is not None:
        _shard_experts(mlp, experts, shard, f"{where}'s experts")
        setattr(layer, name, SummedBlock(mlp, shard.group))
    else:
        _shard_mlp(mlp, shard, f"{where}'s MLP")
    return split


def check_probed_heads(entries, splits: list[tuple[HeadSplit, int]], family: str) -> None:
    """After the adapter's probe: each layer attends with the heads it was given
    (a family that reshapes by a count kept elsewhere than its attention module's
    attributes would attend with wrong head sizes)."""
    if len(entries) != len(splits):
        raise TensorParallelError(f"{family}: {len(splits)} layers keep {len(entries)} KV "
                                  "entries; tensor parallel needs one per layer")
    for i, (entry, (split, head_dim)) in enumerate(zip(entries, splits)):
        got = (entry.num_heads, entry.num_kv_heads, entry.head_dim)
        want = (split.q_local, split.kv_local, head_dim)
        if got != want:
            raise TensorParallelError(
                f"{family}: layer {i}'s sharded attention runs {got[0]} query / {got[1]} KV "
                f"heads of size {got[2]}, not the {want[0]} / {want[1]} of size {want[2]} "
                "it was given; its family keeps head counts where vllm-metal does not "
                "shard them")


def _shard_attention(attention: nn.Module, shard: TensorShard,
                     where: str) -> tuple[HeadSplit, int]:
    out = next((n for n in _OUT_NAMES if _is_linear(getattr(attention, n, None))), None)
    fused = _is_linear(getattr(attention, "qkv_proj", None))   # phi3: [q | k | v] rows
    into = ("qkv_proj",) if fused else ("q_proj", "k_proj", "v_proj")
    if out is None or not all(_is_linear(getattr(attention, n, None)) for n in into):
        raise TensorParallelError(
            f"{where} ({_qualname(attention)}) has no q/k/v (or fused qkv_proj) and output "
            "linear projections (latent or linear attention, or another fused layout); "
            "tensor parallel shards those only")
    heads = _count(attention, _QUERY_HEADS, where, "query")
    kv_heads = _count(attention, _KV_HEADS, where, "KV")
    if fused:
        head_dim, rem = divmod(_out_dims(attention.qkv_proj), heads + 2 * kv_heads)
        widths = (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    else:
        head_dim, rem = divmod(_out_dims(attention.q_proj), heads)
        widths = tuple(_out_dims(getattr(attention, n)) for n in into)
    if rem or widths != (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim):
        raise TensorParallelError(
            f"{where}: projections of {'/'.join(map(str, widths))} outputs do not make "
            f"{heads} query and {kv_heads} KV heads of one size")
    _refuse_other_parameters(attention, (*into, out),
                             {heads, kv_heads, heads * head_dim, kv_heads * head_dim},
                             head_dim, where)
    try:
        split = HeadSplit.of(heads, kv_heads, shard.rank, shard.size)
    except TensorParallelError as e:
        raise TensorParallelError(f"{where}: {e}") from e
    q = (split.q_start * head_dim, split.q_end * head_dim, split.q_local * head_dim)
    kv = (split.kv_start * head_dim, split.kv_end * head_dim, split.kv_local * head_dim)
    if fused:
        k0, v0 = widths[0], widths[0] + widths[1]
        _rows(attention.qkv_proj, [q, (k0 + kv[0], k0 + kv[1], kv[2]),
                                   (v0 + kv[0], v0 + kv[1], kv[2])])
    else:
        for name, span in zip(into, (q, kv, kv)):
            _rows(getattr(attention, name), [span])
    if shard.gather:
        order = _head_order(heads, kv_heads, head_dim, shard.size)
        setattr(attention, out, GatheredToAll(getattr(attention, out), order,
                                              shard.size * q[2], shard.group))
    else:
        setattr(attention, out, _columns(getattr(attention, out), q[0], q[1], shard,
                                         f"{where}'s {out}"))
    for names, count in ((_QUERY_HEADS, split.q_local), (_KV_HEADS, split.kv_local)):
        for name in names:
            if isinstance(getattr(attention, name, None), int):
                setattr(attention, name, count)
    return split, head_dim


def _shard_mlp(mlp: nn.Module, shard: TensorShard, where: str) -> None:
    for into, out in _MLP_SHAPES:
        if all(_is_linear(getattr(mlp, n, None)) for n in (*into, out)):
            break
    else:
        raise TensorParallelError(
            f"{where} ({_qualname(mlp)}) is not a dense MLP of linear projections "
            "(mixture-of-experts MLPs are not sharded by vllm-metal yet)")
    down = getattr(mlp, out)
    width = _in_dims(down)
    # A fused gate_up_proj (phi3) holds [gate | up] rows.
    halves = 2 if into == ("gate_up_proj",) else 1
    if any(_out_dims(getattr(mlp, n)) != width * halves for n in into):
        raise TensorParallelError(f"{where}: {'/'.join(into)} do not feed {out}'s "
                                  f"{width} columns")
    _refuse_other_parameters(mlp, (*into, out), {width}, None, where)
    # Gathered, a slice is any whole number of the int8 kernels' row tiles; summed, it
    # also starts on down's quantization group.
    unit = _INT8_GROUP if shard.gather else _column_unit(down, f"{where}'s {out}")
    spans = _column_spans(width, unit, shard.size, where)
    start, end = spans[shard.rank]
    # Gathered, every rank's slice has one width (all_gather's rule): padded with
    # phantom columns of zero weights, cut off again before down.
    local = max(e - s for s, e in spans) if shard.gather else end - start
    for name in into:
        _rows(getattr(mlp, name), [(h * width + start, h * width + end, local)
                                   for h in range(halves)])
    if shard.gather:
        order = [r * local + c for r, (s, e) in enumerate(spans) for c in range(e - s)]
        setattr(mlp, out, GatheredToAll(down, order, shard.size * local, shard.group))
    else:
        setattr(mlp, out, _columns(down, start, end, shard, f"{where}'s {out}"))


def _experts(block: nn.Module) -> nn.Module | None:
    """The block's SwitchGLU-like experts (gate/up/down of weights [E, out, in]), if any."""
    for name in _EXPERTS_NAMES:
        experts = getattr(block, name, None)
        if isinstance(experts, nn.Module) and all(
                isinstance(getattr(experts, p, None), nn.Module)
                and getattr(experts, p).get("weight") is not None
                and getattr(experts, p)["weight"].ndim == 3
                for p in ("gate_proj", "up_proj", "down_proj")):
            return experts
    return None


def _shard_experts(block: nn.Module, experts: nn.Module, shard: TensorShard,
                   where: str) -> None:
    """Each expert (and the shared expert) keeps this rank's slice of its MLP columns:
    gate/up their rows, down the matching input columns, whose partial products the
    block's SummedBlock all-sums (a bias of down kept on rank 0 only, so it is added
    once)."""
    mlps = [(experts, "experts")]
    shared = next((getattr(block, n) for n in _SHARED_NAMES
                   if isinstance(getattr(block, n, None), nn.Module)), None)
    if shared is not None:
        if not all(_is_linear(getattr(shared, n, None))
                   for n in ("gate_proj", "up_proj", "down_proj")):
            raise TensorParallelError(f"{where}: the shared expert ({_qualname(shared)}) is "
                                      "not a gate/up/down MLP")
        mlps.append((shared, "shared expert"))
    for mlp, what in mlps:
        down = mlp.down_proj
        width = _in_dims(down)
        if any(_out_dims(getattr(mlp, n)) != width for n in ("gate_proj", "up_proj")):
            raise TensorParallelError(f"{where}: the {what}' gate/up do not feed down's "
                                      f"{width} columns")
        unit = _column_unit(down, f"{where}: the {what}' down")
        start, end = _column_spans(width, unit, shard.size, f"{where}: the {what}'")[shard.rank]
        for name in ("gate_proj", "up_proj"):
            _rows(getattr(mlp, name), [(start, end, end - start)])
        _keep_columns(down, start, end)
        if shard.rank and down.get("bias") is not None:
            down["bias"] = mx.zeros_like(down["bias"])


def _column_spans(width: int, unit: int, size: int, where: str) -> list[tuple[int, int]]:
    """Each rank's [start, end) of ``width`` MLP columns, cut on multiples of ``unit``
    (the last may end on ``width``). Raises TensorParallelError when some rank would
    get none."""
    units = -(-width // unit)
    if units < size:
        raise TensorParallelError(f"{where}: {width} columns make fewer than {size} "
                                  f"slices of {unit}")
    return [(unit * (units * r // size), min(width, unit * (units * (r + 1) // size)))
            for r in range(size)]


def _head_order(heads: int, kv_heads: int, head_dim: int, size: int) -> list[int]:
    """For each of the model's query heads in turn, its head_dim columns' positions in
    the ranks' concatenated attention outputs (each rank's q_local heads: its real
    ones first, then phantoms)."""
    splits = [HeadSplit.of(heads, kv_heads, r, size) for r in range(size)]
    order = []
    for h in range(heads):
        r = next(r for r, sp in enumerate(splits) if sp.q_start <= h < sp.q_end)
        first = (r * splits[r].q_local + h - splits[r].q_start) * head_dim
        order.extend(range(first, first + head_dim))
    return order


def _rows(linear: nn.Module, spans: list[tuple[int, int, int]]) -> None:
    """``linear`` keeping, for each (start, end, padded) of ``spans`` in turn, output rows
    [start, end) and then padded - (end - start) rows of zeros (weights, scales and
    biases: a phantom head's projection is 0), in place. Slices are copied
    (mx.contiguous): a view would keep the whole tensor alive."""
    for name in ("weight", "scales", "biases", "bias"):
        array = linear.get(name)
        if array is None:
            continue
        # Rows: a bias's last axis, the others' second-to-last ([out] / [out, in], or
        # an expert stack's [E, out] / [E, out, in]).
        axis = array.ndim - (1 if name == "bias" else 2)
        parts = []
        for start, end, padded in spans:
            parts.append(_take(array, axis, start, end))
            if padded > end - start:
                shape = list(array.shape)
                shape[axis] = padded - (end - start)
                parts.append(mx.zeros(shape, dtype=array.dtype))
        linear[name] = mx.contiguous(parts[0] if len(parts) == 1
                                     else mx.concatenate(parts, axis=axis))


def _take(array: mx.array, axis: int, start: int, end: int) -> mx.array:
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, end)
    return array[tuple(index)]


def _columns(linear: nn.Module, start: int, end: int, shard: TensorShard,
             where: str) -> ShardedToAll:
    """``linear`` keeping input columns [start, end), as a ShardedToAll."""
    unit = _column_unit(linear, where)
    if start % unit or (end % unit and end != _in_dims(linear)):
        raise TensorParallelError(
            f"{where}: this rank's input columns [{start}, {end}) do not start on a "
            f"quantization group of {unit}; use a --tensor-parallel-size that splits the "
            "heads on group boundaries")
    bias = linear.get("bias")
    if bias is not None:
        del linear["bias"]
    _keep_columns(linear, start, end)
    return ShardedToAll(linear, bias, end - start, shard.group)


def _keep_columns(linear: nn.Module, start: int, end: int) -> None:
    """``linear`` (or an expert stack) keeping input columns [start, end), in place."""
    if "scales" in linear:
        per_word = 32 // linear.bits
        linear["weight"] = mx.contiguous(linear["weight"][..., start // per_word:end // per_word])
        group = linear.group_size
        for name in ("scales", "biases"):
            if linear.get(name) is not None:
                linear[name] = mx.contiguous(linear[name][..., start // group:-(-end // group)])
    else:
        linear["weight"] = mx.contiguous(linear["weight"][..., start:end])


def _column_unit(linear: nn.Module, where: str) -> int:
    """Input columns a slice must start on: the quantization group (and whole packed
    words), and the int8 kernels' rounding group."""
    if "scales" in linear:
        if getattr(linear, "mode", "affine") != "affine":
            raise TensorParallelError(f"{where}: {linear.mode} weights are not cut along "
                                      "their input columns by tensor parallel")
        if (32 % linear.bits) or linear.group_size % (32 // linear.bits):
            raise TensorParallelError(f"{where}: {linear.bits}-bit weights do not pack whole "
                                      "into 32-bit words per group; tensor parallel cannot "
                                      "cut them")
        return math.lcm(linear.group_size, _INT8_GROUP)
    return 1


def _is_linear(module) -> bool:
    return isinstance(module, (nn.Linear, nn.QuantizedLinear)) and module["weight"].ndim == 2


def _out_dims(linear: nn.Module) -> int:
    return int(linear["weight"].shape[-2])


def _in_dims(linear: nn.Module) -> int:
    columns = int(linear["weight"].shape[-1])
    return columns * 32 // linear.bits if "scales" in linear else columns


def _count(attention: nn.Module, names: tuple[str, ...], where: str, kind: str) -> int:
    for name in names:
        value = getattr(attention, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise TensorParallelError(f"{where} ({_qualname(attention)}) keeps its {kind} head count "
                              f"under none of {', '.join(names)}")


def _refuse_other_parameters(module: nn.Module, sharded: tuple[str, ...], widths: set[int],
                             head_dim: int | None, where: str) -> None:
    """A parameter beside the sharded projections sized by the heads or columns being
    split (per-head sinks, a norm over all heads) would need a slice too."""
    for name, array in tree_flatten(module.parameters()):
        if name.split(".")[0] in sharded:
            continue
        if any(d in widths and d != head_dim for d in array.shape):
            raise TensorParallelError(
                f"{where}: its parameter {name} {tuple(array.shape)} spans the heads or "
                "columns being split; vllm-metal does not shard it")


def _child(layer: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    for name in names:
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def _qualname(obj) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"
