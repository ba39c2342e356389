"""ModelAdapter: an mlx-lm causal LM as the paged runner drives it.

Nothing here knows a family by name. At load the adapter asks the model what
it does, in the model's own terms:
- ``make_prompt_cache`` says how many KV entries the model keeps and of which
  kind (plain, or a rotating window);
- one probe forward through the backbone, with LayerCaches that record instead
  of computing, says per entry the K/V heads and head size the layer writes and
  the query heads, scale, window and sinks it attends with (the graph is built,
  never evaluated: shapes only);
- one probe of the head says what the family does after the backbone (final
  softcap, logit scaling, a head inside the backbone) by calling the family's
  own ``__call__`` around a stand-in backbone.
What the probe cannot page (another cache kind, a mask array of the family's
own, attention computed outside ``scaled_dot_product_attention``) is refused
by name: UnsupportedModelError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.attention import latent_attention, paged_attention
from vllm_metal.attention.caches.state_pages import GdnStateShape
from vllm_metal.attention.context import (AttentionMetadata, ForwardContext, forward_context,
                                          get_forward_context)
from vllm_metal.attention.layer_cache import LayerCache, install_paged_sdpa
from vllm_metal.attention.state_cache import StateCache, install_paged_gated_delta
from vllm_metal.distributed.pipeline import PipelineStage
from vllm_metal.distributed.tensor import TensorShard
from vllm_metal.models.expert_lists import restack_expert_lists
from vllm_metal.models.state_layers import wrap_state_convs

# Where mlx-lm blocks keep their attention module.
_ATTENTION_NAMES = ("self_attn", "attention", "attn")
# Attributes of a causal LM that hold its backbone.
_BACKBONE_NAMES = ("model", "transformer", "backbone")
# Rows of the probe forward (two, so per-row offsets are exercised).
_PROBE_ROWS = 2


@dataclass(frozen=True)
class _StateSlots:
    """_cache_windows' mark of an entry that keeps a state (an mlx-lm ArraysCache of
    ``slots`` arrays: a hybrid's linear-attention or short-conv layer), not K/V."""

    slots: int


class UnsupportedModelError(ValueError):
    """The model's family cannot be served correctly; the message names what is missing."""


@dataclass(frozen=True)
class KVEntry:
    """What one KV entry holds and how its layer(s) attend over it."""

    num_kv_heads: int
    head_dim: int
    num_heads: int
    scale: float
    window: int | None     # sliding window in tokens; None: full attention
    softcap: float | None
    has_sinks: bool
    # Multi-head latent attention: the latent width of each cached row [latent,
    # k_pe] (head_dim = rank + rope_dim, one KV head); None for K/V attention.
    latent_rank: int | None = None
    # A linear-attention (Gated DeltaNet, Mamba2) layer: its recurrent state instead of K/V
    # (the fields above are then 0 / None).
    state: GdnStateShape | None = None


class ModelAdapter:
    """Drives ``model``'s own code over the paged cache (see the module docstring)."""

    def __init__(self, model: nn.Module, stage: PipelineStage | None = None,
                 tensor: TensorShard | None = None) -> None:
        """``stage``: the pipeline stage whose layers ``model`` holds (cut_layers);
        its entries are then those of its own layers, numbered from 0. ``tensor``: the
        tensor-parallel rank ``model``'s layers were sharded for (shard_model)."""
        self.model = model
        self.family = _family(model)
        self.text_model = _text_model(model)
        self.backbone_name = _backbone_name(self.text_model, self.family)
        self.backbone: nn.Module = getattr(self.text_model, self.backbone_name)
        self.stage = stage
        self.tensor = tensor
        install_paged_sdpa()
        install_paged_gated_delta()
        layered = _layered(model, self.text_model)
        windows, groups = _cache_windows(layered, self.family)
        # The model's entries this process runs (all but under a pipeline stage);
        # entries[j] is held[j]'s.
        self.held = self._held(windows, groups)
        _wrap_self_computing(layered, self.family)
        # Keyed by local entry (the stand-ins of other stages' layers hold no convs).
        self._convs = wrap_state_convs(
            _layers(layered), [j for j, i in enumerate(self.held)
                               if isinstance(windows[i], _StateSlots)],
            self.family, UnsupportedModelError)
        restack_expert_lists(_layers(layered) or [])
        local = {i: j for j, i in enumerate(self.held)}
        self.caches = [self._cache(i, local.get(i), w) for i, w in enumerate(windows)]
        # What the backbone is given: mlx-lm's list, a CacheList as a group.
        self.model_caches = [self.caches[g[0]] if len(g) == 1
                             else _CacheGroup([self.caches[i] for i in g]) for g in groups]
        _place_absolute_positions(self.backbone, self.model_caches)
        self.entries, self.hidden_size = self._probe_backbone(windows)
        self.vocab_size, self.head_in_backbone, self.plain_head = self._probe_head()

    # -- the two halves of a forward ------------------------------------

    def hidden(self, input_ids: mx.array, embeddings: mx.array | None = None) -> mx.array:
        """int32 [T] -> [T, hidden]: the backbone over T rows of one token each,
        inside a forward_context. embeddings [T, hidden]: its input in place of the
        token embeddings (mlx-lm's input_embeddings)."""
        if embeddings is not None:
            out = self.backbone(input_ids[:, None], cache=self.model_caches,
                                input_embeddings=embeddings[:, None, :])
        else:
            out = self.backbone(input_ids[:, None], cache=self.model_caches)
        return out.reshape(out.shape[0], out.shape[-1])

    def logits(self, rows: mx.array) -> mx.array:
        """[R, hidden] -> [R, vocab] through the family's own head."""
        if self.head_in_backbone:
            return rows
        out = self._family_head(rows[:, None, :])
        return out.reshape(rows.shape[0], out.shape[-1])

    def _family_head(self, given: mx.array) -> mx.array:
        """The text model's own ``__call__`` with ``given`` [R, 1, hidden] as its
        backbone's output."""
        return type(self.text_model).__call__(
            _Shell(self.text_model, self.backbone_name, given),
            mx.zeros((given.shape[0], 1), dtype=mx.int32))

    # -- facts ----------------------------------------------------------

    def _held(self, windows: list, groups: list[list[int]]) -> list[int]:
        if self.stage is None:
            return list(range(len(windows)))
        layers = _layers(self.backbone)
        if any(len(g) != 1 for g in groups) or layers is None or len(windows) != len(layers):
            raise UnsupportedModelError(
                f"{self.family}: --pipeline-parallel-size needs one cache per layer; this "
                f"model keeps {len(windows)} for {len(layers or ())} layers")
        return list(range(self.stage.start, self.stage.end))

    def _cache(self, i: int, j: int | None, window) -> LayerCache | StateCache:
        """Entry i's cache, writing local entry j; a layer another pipeline stage runs
        (j None) gets a cache that only makes masks (its stand-in never attends)."""
        if isinstance(window, _StateSlots):
            return (StateCache(-1, window.slots) if j is None
                    else self._state_cache(i, j, window.slots))
        return LayerCache(-1 if j is None else j)

    def _probe_backbone(self, windows: list) -> tuple[list[KVEntry], int]:
        probe = _Probe(len(self.held))
        ids = mx.zeros((_PROBE_ROWS, 1), dtype=mx.int32)
        try:
            with forward_context(probe):
                out = self.backbone(ids, cache=self.model_caches)
        except UnsupportedModelError as e:
            raise UnsupportedModelError(f"{self.family}: {e}") from e
        except Exception as e:
            why = ""
            if "PagedMask" in str(e):
                why = (" (its attention computes with the mask as an array, e.g. latent "
                       "attention, where the paged kernels take only causal and window masks)")
            elif "StateRef" in str(e):
                why = (" (a recurrent layer computes with its state itself, e.g. Mamba 1's "
                       "selective scan, where vllm-metal pages Gated DeltaNet and Mamba2 "
                       "mixers only)")
            raise UnsupportedModelError(
                f"{self.family}: its mlx-lm backbone {_qualname(self.backbone)} does not run "
                f"on vllm-metal's paged cache{why} ({type(e).__name__}: {_first_line(e)})") from e
        entries = []
        for j, i in enumerate(self.held):
            rotating = windows[i]
            if isinstance(rotating, _StateSlots):
                entries.append(self._state_entry(i, j, probe))
                continue
            kv, attn = probe.kv.get(j), probe.attn.get(j)
            if kv is None:
                raise UnsupportedModelError(
                    f"{self.family}: KV entry {i} was never written through "
                    f"cache.update_and_fetch ({self._where(i)})")
            if attn is None:
                raise UnsupportedModelError(
                    f"{self.family}: {self._where(i)} computes attention itself instead of "
                    "through mlx-lm's scaled_dot_product_attention; vllm-metal cannot page it")
            num_kv_heads, head_dim, value_dim = kv
            num_heads, scale, window, softcap, sinks = attn
            latent = probe.latent.get(j)
            if value_dim != head_dim and latent is None:
                raise UnsupportedModelError(
                    f"{self.family}: {self._where(i)} has keys of size {head_dim} and values "
                    f"of size {value_dim}; the paged cache holds equal sizes")
            if num_heads % num_kv_heads:
                raise UnsupportedModelError(
                    f"{self.family}: {self._where(i)} has {num_heads} query heads, not a "
                    f"multiple of its {num_kv_heads} KV heads")
            if window is None:
                window = rotating
            elif rotating is not None and rotating != window:
                raise UnsupportedModelError(
                    f"{self.family}: KV entry {i} keeps {rotating} tokens but its layer "
                    f"masks a window of {window}")
            entries.append(KVEntry(num_kv_heads, head_dim, num_heads, scale, window,
                                   softcap, sinks, latent))
        return entries, int(out.shape[-1])

    def _state_cache(self, i: int, j: int, slots: int) -> StateCache:
        """Slots of conv inputs, one per conv, then (GDN) the recurrent state; layer
        i's, as local entry j."""
        convs = len(self._convs[j][1])
        if slots not in (convs, convs + 1):
            raise UnsupportedModelError(
                f"{self.family}: {self._where(i)} keeps {slots} state arrays for {convs} "
                "convolutions; vllm-metal pages conv inputs plus at most one recurrent state")
        return StateCache(j, slots, recurrent=slots == convs + 1)

    def _state_entry(self, i: int, j: int, probe: _Probe) -> KVEntry:
        kernel, channels = self._convs[j]
        recurrent = self.caches[i].recurrent
        convs, rule = probe.conv.get(j, set()), probe.rule.get(j)
        if convs != set(range(len(channels))) or recurrent != (rule is not None):
            what = ("each of its convs" if rule is not None or not recurrent
                    else "mlx-lm's gated_delta_update or ssm_update")
            raise UnsupportedModelError(
                f"{self.family}: {self._where(i)} keeps a recurrent state but did not run "
                f"{what} on it once per token; vllm-metal pages short convolutions, Gated "
                "DeltaNet and Mamba2 mixers only")
        if rule is None:    # short convolutions only (LFM2)
            return KVEntry(0, 0, 0, 0.0, None, None, False,
                           state=GdnStateShape(kernel, channels, 0, 0, 0))
        num_k_heads, head_k_dim, num_v_heads, head_v_dim, delta = rule
        if num_v_heads % num_k_heads:
            raise UnsupportedModelError(
                f"{self.family}: {self._where(i)} has {num_v_heads} value heads, not a "
                f"multiple of its {num_k_heads} key heads")
        shape = GdnStateShape(kernel, channels, num_v_heads, head_v_dim, head_k_dim, delta)
        return KVEntry(0, 0, 0, 0.0, None, None, False, state=shape)

    def _probe_head(self) -> tuple[int, bool, tuple[nn.Module, bool] | None]:
        """(vocab size, head inside the backbone, the plain linear head if the family
        applies nothing after it: (module, tied))."""
        dtype = _float_dtype(self.model)
        rows = mx.random.normal((_PROBE_ROWS, self.hidden_size), key=mx.random.key(0)).astype(dtype)
        given = rows[:, None, :]
        out = self._family_head(given)
        if out is given:   # the backbone ends in the head (gpt_neox)
            return self.hidden_size, True, None
        logits = out.reshape(_PROBE_ROWS, out.shape[-1])
        for head, tied in _head_candidates(self.text_model, self.backbone):
            try:
                mine = head.as_linear(rows) if tied else head(rows)
            except Exception:  # not a linear of these shapes
                continue
            if mine.shape == logits.shape and bool(mx.array_equal(mine, logits)):
                return int(logits.shape[-1]), False, (head, tied)
        return int(logits.shape[-1]), False, None

    def _where(self, entry: int) -> str:
        layers = _layers(self.text_model)
        if layers is not None and len(layers) == len(getattr(self, "caches", layers)):
            attn = _attention_of(layers[entry])
            if attn is not None:
                return f"layer {entry}'s attention {_qualname(attn)}"
            return f"layer {entry} ({_qualname(layers[entry])})"
        return f"KV entry {entry}"


class _Probe(ForwardContext):
    """A forward context that records what each KV entry's layer writes and asks
    for, and answers attention with zeros of the right shape."""

    def __init__(self, num_entries: int) -> None:
        rows = _PROBE_ROWS
        meta = AttentionMetadata(
            positions=mx.arange(rows, dtype=mx.int32), cu_seqlens_q=mx.array([0, rows]),
            seq_lens=mx.array([rows]), block_tables=[mx.zeros((1, 1), dtype=mx.int32)],
            slot_mapping=[mx.arange(rows, dtype=mx.int32)])
        super().__init__(meta, [None] * num_entries, [None] * num_entries)
        self.kv: dict[int, tuple[int, int, int]] = {}
        self.attn: dict[int, tuple[int, float, int | None, float | None, bool]] = {}
        self.latent: dict[int, int] = {}   # MLA entries: their latent rank
        self.conv: dict[int, set[int]] = {}   # state entries: the convs that ran
        # state entries: (key heads, key size, value heads, value size, delta rule)
        self.rule: dict[int, tuple[int, int, int, int, bool]] = {}

    def write(self, entry: int, keys: mx.array, values: mx.array) -> None:
        _check_rows(keys, values)
        self.kv[entry] = (int(keys.shape[1]), int(keys.shape[3]), int(values.shape[3]))
        self._written[id(keys)] = (entry, keys)

    def attend(self, entry: int, queries: mx.array, scale: float, window: int | None,
               softcap: float | None = None, sinks: mx.array | None = None) -> mx.array:
        _check_rows(queries)
        if entry not in self.kv:
            raise UnsupportedModelError(f"KV entry {entry} is attended before it is written")
        self.attn[entry] = (int(queries.shape[1]), float(scale), window,
                            None if softcap is None else float(softcap), sinks is not None)
        shape = (queries.shape[0], queries.shape[1], 1, self.kv[entry][2])
        return mx.zeros(shape, dtype=queries.dtype)


    def short_conv(self, entry: int, index: int, x: mx.array, weight: mx.array) -> mx.array:
        if x.shape[0] != _PROBE_ROWS:
            raise UnsupportedModelError(f"conv rows of shape {tuple(x.shape)}")
        self.conv.setdefault(entry, set()).add(index)
        return mx.zeros(x.shape, dtype=x.dtype)

    def gated_delta(self, entry: int, q: mx.array, k: mx.array, v: mx.array, g: mx.array,
                    beta: mx.array, delta: bool = True) -> mx.array:
        if q.ndim != 3 or q.shape[0] != _PROBE_ROWS or v.ndim != 3 or k.shape != q.shape:
            raise UnsupportedModelError(f"gated delta rows q {tuple(q.shape)}, v {tuple(v.shape)}")
        self.rule[entry] = (int(q.shape[1]), int(q.shape[2]), int(v.shape[1]), int(v.shape[2]),
                            bool(delta))
        return mx.zeros(v.shape, dtype=q.dtype)

    def write_latent(self, entry: int, latent: mx.array, k_pe: mx.array) -> None:
        if latent.ndim != 2 or k_pe.ndim != 2 or latent.shape[0] != _PROBE_ROWS:
            raise UnsupportedModelError(f"latent rows of shape {tuple(latent.shape)}")
        width = int(latent.shape[1] + k_pe.shape[1])
        self.kv[entry] = (1, width, width)
        self.latent[entry] = int(latent.shape[1])

    def attend_latent(self, entry: int, q_latent: mx.array, q_pe: mx.array,
                      scale: float) -> mx.array:
        if entry not in self.latent:
            raise UnsupportedModelError(f"KV entry {entry} is attended before it is written")
        self.attn[entry] = (int(q_latent.shape[1]), float(scale), None, None, False)
        return mx.zeros(q_latent.shape, dtype=q_latent.dtype)


def _check_rows(*arrays: mx.array) -> None:
    for a in arrays:
        if a.ndim != 4 or a.shape[0] != _PROBE_ROWS or a.shape[2] != 1:
            raise UnsupportedModelError(
                f"attention saw shape {tuple(a.shape)}, not one token per row "
                f"[{_PROBE_ROWS}, heads, 1, head_dim]")


class _Shell:
    """The text model with its backbone replaced by ``rows``: the family's own
    ``__call__`` then applies exactly its head and what follows it."""

    def __init__(self, text_model: nn.Module, backbone_name: str, rows: mx.array) -> None:
        self._shell_model = text_model
        self._shell_backbone = _Rows(getattr(text_model, backbone_name), rows)
        self._shell_name = backbone_name

    def __getattr__(self, name: str) -> Any:
        if name == self._shell_name:
            return self._shell_backbone
        return getattr(self._shell_model, name)


class _Rows:
    """A backbone that returns given hidden rows; its other attributes (the
    embedding a tied head reads) are the real backbone's."""

    def __init__(self, backbone: nn.Module, rows: mx.array) -> None:
        self._rows_backbone = backbone
        self._rows = rows

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        return self._rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rows_backbone, name)


def backbone_layers(model: nn.Module) -> list:
    """The backbone's own list of decoder layers (what pipeline stages cut and tensor
    parallel shards)."""
    text_model = _text_model(model)
    backbone = getattr(text_model, _backbone_name(text_model, _family(model)))
    layers = backbone.get("layers") if isinstance(backbone, dict) else None
    if not isinstance(layers, list):
        raise UnsupportedModelError(
            f"{_family(model)}: {_qualname(backbone)} keeps no list of layers; "
            "--pipeline-parallel-size and --tensor-parallel-size work on such a list")
    return layers


def family_name(model: nn.Module) -> str:
    """The model's mlx-lm model_type (what messages name it by)."""
    return _family(model)


def _family(model: nn.Module) -> str:
    for owner in (model, getattr(model, "args", None), getattr(model, "config", None)):
        name = getattr(owner, "model_type", None)
        if isinstance(name, str) and name:
            return name
    return type(model).__module__.rsplit(".", 1)[-1]


def _text_model(model: nn.Module) -> nn.Module:
    """The causal LM inside a multimodal wrapper (served text-only), else the model."""
    inner = getattr(model, "language_model", None)
    return _text_model(inner) if isinstance(inner, nn.Module) else model


def _layered(model: nn.Module, text_model: nn.Module) -> nn.Module:
    """What lists the decoder layers (and makes mlx-lm's cache): the text model, or the
    multimodal wrapper when only it does (Kimi K2.5's `layers` lives on the wrapper)."""
    if _layers(text_model) is not None or hasattr(text_model, "make_cache"):
        return text_model
    if _layers(model) is not None or hasattr(model, "make_cache"):
        return model
    return text_model


def _backbone_name(text_model: nn.Module, family: str) -> str:
    for name in _BACKBONE_NAMES:
        if isinstance(getattr(text_model, name, None), nn.Module):
            return name
    raise UnsupportedModelError(
        f"{family}: {_qualname(text_model)} has no backbone under "
        f"{' or '.join('.' + n for n in _BACKBONE_NAMES)}")


def _cache_windows(text_model: nn.Module,
                   family: str) -> tuple[list[int | _StateSlots | None], list[list[int]]]:
    """One entry per KV cache mlx-lm makes for the model: None for a plain cache,
    the size of a rotating (sliding-window) one, _StateSlots for an ArraysCache (conv
    inputs, then maybe a recurrent state: what the probe finds the layer doing with
    it decides whether it is paged or refused). A CacheList (a layer with a state and
    attention side by side, as Falcon-H1's) gives an entry per cache in it; also
    returns, per cache mlx-lm makes, the entries it became."""
    from mlx_lm.models.cache import ArraysCache, CacheList, make_prompt_cache

    try:
        made = make_prompt_cache(text_model)
    except Exception as e:
        raise UnsupportedModelError(
            f"{family}: mlx-lm cannot make its cache ({type(e).__name__}: {e})") from e
    windows: list[int | _StateSlots | None] = []
    groups: list[list[int]] = []
    for cache in made:
        # Only a state beside attention is split: other CacheLists (two attentions
        # in a layer, a sparse-attention indexer's cache) are refused as one entry.
        split = type(cache) is CacheList and any(type(c) is ArraysCache for c in cache.caches)
        parts = list(cache.caches) if split else [cache]
        groups.append(list(range(len(windows), len(windows) + len(parts))))
        windows.extend(_window_of(part, len(windows) + n, family)
                       for n, part in enumerate(parts))
    if not windows:
        raise UnsupportedModelError(f"{family}: the model keeps no KV cache")
    return windows, groups


def _window_of(cache, entry: int, family: str) -> int | _StateSlots | None:
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    if type(cache) is KVCache:
        return None
    if type(cache) is ArraysCache:
        return _StateSlots(len(cache.cache))  # [conv inputs..., state?]
    if type(cache) is RotatingKVCache and not cache.keep:
        return int(cache.max_size)
    raise UnsupportedModelError(
        f"{family}: KV entry {entry} is mlx-lm's {type(cache).__name__}"
        f"{' keeping ' + str(cache.keep) + ' tokens' if getattr(cache, 'keep', 0) else ''}"
        "; vllm-metal pages plain and sliding-window attention caches and Gated "
        "DeltaNet and Mamba2 states")


class _CacheGroup:
    """What a layer given an mlx-lm CacheList indexes: its entries' caches."""

    def __init__(self, caches: list) -> None:
        self.caches = tuple(caches)

    def __getitem__(self, index: int):
        return self.caches[index]

    def __len__(self) -> int:
        return len(self.caches)


def _layers(text_model: nn.Module) -> list | None:
    try:
        layers = text_model.layers
    except Exception:
        return None
    return list(layers) if isinstance(layers, (list, tuple)) else None


def _attention_of(layer: nn.Module) -> nn.Module | None:
    for name in _ATTENTION_NAMES:
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def _wrap_self_computing(text_model: nn.Module, family: str) -> None:
    """Swap the attention modules PagedAttention or LatentAttention reproduce
    (idempotent); a latent one whose wrapper does not reproduce it is refused."""
    hidden = None
    checked: set[type] = set()  # the check is of the class's code: once per class
    for layer in _layers(text_model) or ():
        for name in _ATTENTION_NAMES:
            module = getattr(layer, name, None)
            if not isinstance(module, nn.Module):
                continue
            if paged_attention.wraps(module):
                setattr(layer, name, paged_attention.PagedAttention(module))
            elif latent_attention.is_latent(module):
                try:
                    wrapper = latent_attention.LatentAttention(module)
                except ValueError as e:
                    raise UnsupportedModelError(f"{family}: {_qualname(module)}: {e}") from e
                if type(module) not in checked:
                    if hidden is None:
                        hidden = _hidden_size(module)
                    try:
                        why = latent_attention.check_latent(wrapper, hidden,
                                                            _float_dtype(module))
                    except Exception as e:  # the module's own code failed the check
                        why = f"its check failed ({type(e).__name__}: {e})"
                    if why is not None:
                        raise UnsupportedModelError(f"{family}: {_qualname(module)}: {why}")
                    checked.add(type(module))
                wrapper.drop_expanded()
                setattr(layer, name, wrapper)


def _hidden_size(attention: nn.Module) -> int:
    """The model width an attention module reads (its o_proj's output rows)."""
    return int(attention.o_proj["weight"].shape[0])


class RowPositions(nn.Module):
    """A learned position table looked up at each row's own position."""

    def __init__(self, table: nn.Module) -> None:
        super().__init__()
        self.table = table

    def __call__(self, position_ids: mx.array) -> mx.array:
        """position_ids (ignored: the backbone's own, from a scalar offset) ->
        [total_q, 1, hidden]."""
        positions = get_forward_context().metadata.positions
        return self.table(positions)[:, None, :]


class _ScalarOffsetCache(LayerCache):
    """Entry 0 of a backbone that builds position ids with numpy from a scalar
    ``cache[0].offset``; RowPositions supplies the real positions."""

    @property
    def offset(self) -> int:
        return 0


# Backbones whose position ids come from numpy over a scalar offset (mlx-lm's
# gpt_bigcode; mlx-lm's own batched generation cannot run it either): the
# table is looked up at each row's position instead. Its layers read no offset.
_NUMPY_POSITIONS = {("mlx_lm.models.gpt_bigcode", "GPTBigCodeModel"): "wpe"}


def _place_absolute_positions(backbone: nn.Module, caches: list[LayerCache]) -> None:
    kind = type(backbone)
    table = _NUMPY_POSITIONS.get((kind.__module__, kind.__name__))
    if table is None:
        return
    if not isinstance(getattr(backbone, table), RowPositions):
        setattr(backbone, table, RowPositions(getattr(backbone, table)))
    caches[0] = _ScalarOffsetCache(0)


def _head_candidates(text_model: nn.Module, backbone: nn.Module):
    for name in ("lm_head", "output", "embed_out"):
        head = getattr(text_model, name, None)
        if isinstance(head, nn.Module):
            yield head, False
    for name in ("embed_tokens", "tok_embeddings", "wte", "embed_in"):
        embed = getattr(backbone, name, None)
        if isinstance(embed, nn.Module) and hasattr(embed, "as_linear"):
            yield embed, True


def _float_dtype(model: nn.Module) -> mx.Dtype:
    from mlx.utils import tree_flatten

    for _, p in tree_flatten(model.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            return p.dtype
    return mx.float32


def _qualname(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__name__}"


def _first_line(e: Exception) -> str:
    """An exception's message up to its first line break (nanobind's argument errors
    list every overload on lines of their own)."""
    text = str(e)
    return text.splitlines()[0] if text else ""
