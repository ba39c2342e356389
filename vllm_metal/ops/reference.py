"""Pure-MLX versions of the native ops: same signatures, written to be obviously right.

They gather pages and build explicit masks, compute in float32, and read the
index metadata on the host (``tolist``), so they are for tests, documentation
and debugging, not for speed.
"""

from __future__ import annotations

import math

import mlx.core as mx


def reshape_and_cache_ref(
    key: mx.array,
    value: mx.array,
    key_cache: mx.array,
    value_cache: mx.array,
    slot_mapping: mx.array,
    key_columns: bool = False,
) -> tuple[mx.array, mx.array]:
    """New caches with key/value rows [num_tokens, H_kv, D] written at their slots.

    Caches are [num_blocks, block_size, H_kv, D] (with key_columns the key
    cache is [num_blocks, H_kv, D, block_size]); slot = block * block_size +
    offset; negative slots are skipped. Unlike the native op this returns new
    arrays and leaves the inputs untouched.
    """
    if key_columns:
        keys, values = reshape_and_cache_ref(
            key, value, key_columns_as_rows(key_cache), value_cache, slot_mapping)
        return rows_as_key_columns(keys), values
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
    slots = slot_mapping.tolist()
    rows = [i for i, slot in enumerate(slots) if slot >= 0]
    bad = [slots[i] for i in rows if slots[i] >= num_blocks * block_size]
    if bad:
        raise ValueError(f"slot_mapping has slots {bad} outside {num_blocks * block_size} slots")
    if not rows:
        return key_cache, value_cache
    dst = mx.array([slots[i] for i in rows])
    src = mx.array(rows)

    def write(cache: mx.array, new: mx.array) -> mx.array:
        flat = cache.reshape(num_blocks * block_size, num_kv_heads, head_size)
        flat[dst] = new[src].astype(cache.dtype)
        return flat.reshape(cache.shape)

    return write(key_cache, key), write(value_cache, value)


def key_columns_as_rows(key_cache: mx.array) -> mx.array:
    """Key columns [num_blocks, H_kv, D, block_size] -> rows [num_blocks, block_size, H_kv, D]."""
    return key_cache.transpose(0, 3, 1, 2)


def rows_as_key_columns(key_cache: mx.array) -> mx.array:
    """Rows [num_blocks, block_size, H_kv, D] -> key columns [num_blocks, H_kv, D, block_size]."""
    return mx.contiguous(key_cache.transpose(0, 2, 3, 1))


def kv_rows_ref(rows: mx.array, head_size: int, kv_quant: str, keys: bool) -> mx.array:
    """uint8 rows of a cache in format ``kv_quant`` (csrc/kv_quant.h) -> float32
    [..., head_size], for the formats with 4-bit rows:
    - "rot4" keys [..., head_size / 2 + 4]: the levels of N(0, 1) picked times the
      row's factor, rotated back by the Hadamard matrix;
    - "k8v4" keys [..., head_size + 4]: e4m3 codes times the row's float32 scale;
    - values of both [..., head_size / 2 + 4]: minimum + code * step."""
    from vllm_metal.attention.rotated_kv import hadamard, lloyd_max_levels

    if kv_quant not in ("rot4", "k8v4"):
        raise NotImplementedError(f"kv_rows_ref reads rot4 and k8v4 rows, not {kv_quant}")
    if keys and kv_quant == "k8v4":
        scale = mx.view(rows[..., head_size:head_size + 4], mx.float32)  # [..., 1]
        return mx.from_fp8(rows[..., :head_size], dtype=mx.float32) * scale
    half = head_size // 2
    packed = rows[..., :half].astype(mx.uint32)
    codes = mx.stack([packed & 15, packed >> 4], axis=-1).reshape(*rows.shape[:-1], head_size)
    tail = rows[..., half:half + 4]
    if keys:
        factor = mx.view(tail, mx.float32)  # [..., 1]
        levels = mx.array(lloyd_max_levels(1, 4), dtype=mx.float32)
        rotated = mx.take(levels, codes) * factor
        return rotated @ mx.array(hadamard(head_size), dtype=mx.float32)
    step, minimum = mx.split(mx.view(tail, mx.float16).astype(mx.float32), 2, axis=-1)
    return minimum + codes.astype(mx.float32) * step


def paged_attention_ref(
    query: mx.array,
    key_cache: mx.array,
    value_cache: mx.array,
    block_tables: mx.array,
    seq_lens: mx.array,
    cu_seqlens_q: mx.array,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: mx.array | None = None,
    kv_quant: str | None = None,
    key_columns: bool = False,
    key_ends: mx.array | None = None,
) -> mx.array:
    """Attention of query [total_q, H, D] over paged caches; returns [total_q, H, D].

    Per sequence: gather its pages into dense K/V [ctx, H_kv, D], repeat them
    for the H / H_kv query heads of each group, mask causally (and to the last
    ``sliding_window`` positions), soft-cap, softmax with an optional sink
    column, then weight V. kv_quant "rot4" / "k8v4": the caches are decoded
    first (kv_rows_ref); other formats have no reference here. key_columns: the
    key cache is [num_blocks, H_kv, D, block_size]. key_ends int [total_q]: a row
    also sees the keys after it before its entry (ops.paged_attention).
    """
    total_q, num_heads, head_size = query.shape
    if key_columns:
        key_cache = key_columns_as_rows(key_cache)
    if kv_quant is not None:
        key_cache = kv_rows_ref(key_cache, head_size, kv_quant, keys=True)
        value_cache = kv_rows_ref(value_cache, head_size, kv_quant, keys=False)
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    lens = seq_lens.tolist()
    starts = cu_seqlens_q.tolist()
    outputs = []
    for i, ctx in enumerate(lens):
        q_len = starts[i + 1] - starts[i]
        if q_len == 0:
            continue
        blocks = block_tables[i, : math.ceil(ctx / block_size)]
        k = key_cache[blocks].reshape(-1, num_kv_heads, head_size)[:ctx]
        v = value_cache[blocks].reshape(-1, num_kv_heads, head_size)[:ctx]
        k = mx.repeat(k.astype(mx.float32), group, axis=1)  # [ctx, H, D]
        v = mx.repeat(v.astype(mx.float32), group, axis=1)
        q = query[starts[i] : starts[i + 1]].astype(mx.float32)  # [q_len, H, D]

        scores = mx.einsum("qhd,khd->hqk", q, k) * scale  # [H, q_len, ctx]
        if softcap is not None:
            scores = softcap * mx.tanh(scores / softcap)
        q_pos = mx.arange(ctx - q_len, ctx)[:, None]
        k_pos = mx.arange(ctx)[None, :]
        allowed = k_pos <= q_pos
        if key_ends is not None:
            ends = key_ends[starts[i] : starts[i + 1]].astype(mx.int32)[:, None]
            allowed = allowed | (k_pos < ends)
        if sliding_window is not None:
            allowed = allowed & (k_pos > q_pos - sliding_window)
        scores = mx.where(allowed, scores, -mx.inf)
        if sinks is not None:
            sink = mx.broadcast_to(
                sinks.astype(mx.float32)[:, None, None], (num_heads, q_len, 1))
            probs = mx.softmax(mx.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]
        else:
            probs = mx.softmax(scores, axis=-1)
        outputs.append(mx.einsum("hqk,khd->qhd", probs, v))
    if not outputs:
        return mx.zeros((total_q, num_heads, head_size), dtype=query.dtype)
    return mx.concatenate(outputs, axis=0).astype(query.dtype)


def latent_cache_write_ref(latent: mx.array, k_pe: mx.array, cache: mx.array,
                           slot_mapping: mx.array) -> mx.array:
    """The cache with rows [latent[t], k_pe[t]] at slot_mapping[t] (negative: skipped)."""
    rows = mx.concatenate([latent, k_pe], axis=-1).astype(cache.dtype)
    slots = slot_mapping.tolist()
    src = [i for i, slot in enumerate(slots) if slot >= 0]
    flat = cache.reshape(-1, cache.shape[-1])
    if src:
        flat[mx.array([slots[i] for i in src])] = rows[mx.array(src)]
    return flat.reshape(cache.shape)


def mla_attention_ref(q_latent: mx.array, q_pe: mx.array, cache: mx.array,
                      block_tables: mx.array, seq_lens: mx.array, cu_seqlens_q: mx.array,
                      scale: float) -> mx.array:
    """Weight-absorbed MLA over a paged latent cache in float32; returns [T, H, rank].

    Per sequence: gather its rows [ctx, rank + rope_dim], score each query head
    against them (latent and positional parts), mask causally, softmax, weight
    the latents."""
    rank = q_latent.shape[-1]
    block_size = cache.shape[1]
    starts = cu_seqlens_q.tolist()
    outputs = []
    for i, ctx in enumerate(seq_lens.tolist()):
        q_len = starts[i + 1] - starts[i]
        if q_len == 0:
            continue
        blocks = block_tables[i, : math.ceil(ctx / block_size)]
        rows = cache[blocks].reshape(-1, cache.shape[-1])[:ctx].astype(mx.float32)
        q = mx.concatenate([q_latent[starts[i]:starts[i + 1]],
                            q_pe[starts[i]:starts[i + 1]]], axis=-1).astype(mx.float32)
        scores = mx.einsum("qhd,kd->hqk", q, rows) * scale
        allowed = mx.arange(ctx)[None, :] <= mx.arange(ctx - q_len, ctx)[:, None]
        probs = mx.softmax(mx.where(allowed, scores, -mx.inf), axis=-1)
        outputs.append(mx.einsum("hqk,kd->qhd", probs, rows[:, :rank]))
    if not outputs:
        return mx.zeros(q_latent.shape, dtype=q_latent.dtype)
    return mx.concatenate(outputs, axis=0).astype(q_latent.dtype)


def quantized_matmul_ref(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, *,
                         bits: int, group_size: int, bias: mx.array | None = None) -> mx.array:
    """x [..., K] @ W.T for MLX affine-quantized W; returns [..., N].

    MLX's own quantized matmul, computed in float32 (its CPU kernel is very slow
    for bfloat16/float16 scales); the result has the dtype MLX would give.
    """
    out = mx.quantized_matmul(
        x.astype(mx.float32), w, scales=scales.astype(mx.float32),
        biases=biases.astype(mx.float32), transpose=True, group_size=group_size, bits=bits)
    if bias is not None:
        out = out + bias.astype(mx.float32)
    return out.astype(_result_type(x, scales, bias))


def dense_matmul_ref(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """x [..., K] @ w.T (w [N, K]) in float32; returns [..., N] in the dtype MLX
    would give."""
    out = x.astype(mx.float32) @ w.astype(mx.float32).T
    if bias is not None:
        out = out + bias.astype(mx.float32)
    return out.astype(_result_type(x, w, bias))


def expert_matmul_ref(x: mx.array, idx: mx.array, w: mx.array, scales: mx.array | None = None,
                      biases: mx.array | None = None, *, bits: int = 0, group_size: int = 0,
                      bias: mx.array | None = None, mode: str = "affine") -> mx.array:
    """x [R, K], idx [P], experts w [E, N, K] (or quantized, as ops.experts.expert_matmul)
    -> [P, N]: each pair's row times its expert's dequantized matrix, in float32."""
    if mode == "mxfp4":
        dense = mx.dequantize(w, scales, None, group_size=32, bits=4, mode="mxfp4",
                              dtype=mx.float32)
    elif bits:
        dense = mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32),
                              group_size=group_size, bits=bits)
    else:
        dense = w.astype(mx.float32)
    rows = mx.repeat(x.astype(mx.float32), idx.shape[0] // max(x.shape[0], 1), axis=0)
    picked = dense[idx.astype(mx.int32)]                      # [P, N, K]
    out = (picked @ rows[:, :, None])[:, :, 0]
    if bias is not None:
        out = out + bias.astype(mx.float32)[idx.astype(mx.int32)]
    return out.astype(_result_type(x, scales if bits and mode != "mxfp4" else
                                   (x if mode == "mxfp4" else w), bias))


def _result_type(*arrays: mx.array | None) -> mx.Dtype:
    return mx.result_type(*(a.dtype for a in arrays if a is not None))


def embedding_gather_ref(ids: mx.array, table: mx.array, scales: mx.array | None = None,
                         biases: mx.array | None = None, *, bits: int | None = None,
                         group_size: int | None = None) -> mx.array:
    """Rows ids [...] of a dense [V, D] or quantized table; returns [..., D].

    Raises ValueError for ids outside [0, V) (checked on the host).
    """
    flat = ids.reshape(-1).astype(mx.int32)
    values = flat.tolist()
    bad = [v for v in values if not 0 <= v < table.shape[0]]
    if bad:
        raise ValueError(f"ids {bad} are outside the table's {table.shape[0]} rows")
    if scales is None:
        rows = mx.take(table, flat, axis=0)
    else:
        rows = mx.dequantize(mx.take(table, flat, axis=0), mx.take(scales, flat, axis=0),
                             mx.take(biases, flat, axis=0), group_size=group_size, bits=bits)
        rows = rows.astype(scales.dtype)
    return rows.reshape(*ids.shape, rows.shape[-1])


def lora_delta_ref(x: mx.array, idx: mx.array, lora_a: mx.array, lora_b: mx.array,
                   scale: mx.array) -> mx.array:
    """Each row's LoRA update: x [..., in] (T rows), idx [T] in [-1, L) (-1: none),
    lora_a [L, r, in], lora_b [L, r, out], scale [L]; returns [..., out] in x's dtype.

    Per adapter slot in use: its rows of x, through A then B, in float32.
    Raises ValueError for an idx outside [-1, L) (checked on the host).
    """
    slots, out = lora_a.shape[0], lora_b.shape[2]
    rows = x.reshape(-1, x.shape[-1]).astype(mx.float32)
    values = idx.tolist()
    bad = [v for v in values if not -1 <= v < slots]
    if bad:
        raise ValueError(f"idx {bad} are outside [-1, {slots})")
    delta = mx.zeros((rows.shape[0], out), dtype=mx.float32)
    for slot in sorted(set(values) - {-1}):
        mine = mx.array([t for t, v in enumerate(values) if v == slot])
        a, b = lora_a[slot].astype(mx.float32), lora_b[slot].astype(mx.float32)
        delta[mine] = scale[slot].astype(mx.float32) * ((rows[mine] @ a.T) @ b)
    return delta.reshape(*x.shape[:-1], out).astype(x.dtype)


def lora_apply_ref(y: mx.array, x: mx.array, idx: mx.array, lora_a: mx.array, lora_b: mx.array,
                   scale: mx.array, column_offset: int = 0) -> mx.array:
    """y [..., out_cols] with lora_delta_ref's update (in float32, before rounding)
    added to columns [column_offset, column_offset + out); rows with idx -1 and
    the other columns keep y's values. Returns y's shape and dtype."""
    out = lora_b.shape[2]
    update = lora_delta_ref(x.astype(mx.float32), idx, lora_a, lora_b, scale)
    rows = [t for t, v in enumerate(idx.tolist()) if v != -1]
    flat = y.reshape(-1, y.shape[-1])
    result = flat.astype(mx.float32)
    if rows:
        picked = mx.array(rows)
        columns = slice(column_offset, column_offset + out)
        result[picked, columns] = result[picked, columns] + update.reshape(-1, out)[picked]
    return result.astype(y.dtype).reshape(y.shape)  # untouched entries: y's own bits


def short_conv_ref(x: mx.array, weight: mx.array, conv_state: mx.array, state_slots: mx.array,
                   cu_seqlens: mx.array, has_state: mx.array) -> tuple[mx.array, mx.array]:
    """The short causal depthwise convolution of linear-attention layers (Gated DeltaNet,
    Mamba 2) over a packed batch, continuing each sequence from its state slot.

    x [T, C]; weight [C, K]; conv_state [num_slots, K - 1, C]: a slot's last K - 1 inputs;
    state_slots int [N]; cu_seqlens int [N + 1]; has_state bool [N] (False: the
    sequence starts here, from zeros).
    Returns (y [T, C]: y[t] = sum_j weight[:, j] * z[t + j] with z = [state; x] of the
    row's sequence, no activation; conv_state with each slot's last K - 1 inputs).
    """
    kernel = weight.shape[1]
    cu = [int(c) for c in cu_seqlens.tolist()]
    ys, state = [], mx.array(conv_state)  # a copy: the caller's array stays as it was
    for n, slot in enumerate(int(s) for s in state_slots.tolist()):
        rows = x[cu[n]:cu[n + 1]]
        start = state[slot] if bool(has_state[n].item()) else mx.zeros_like(state[slot])
        z = mx.concatenate([start.astype(rows.dtype), rows], axis=0)
        z32, w32 = z.astype(mx.float32), weight.astype(mx.float32)
        ys.append(sum(w32[:, j] * z32[j:j + rows.shape[0]] for j in range(kernel)))
        state[slot] = z[z.shape[0] - (kernel - 1):].astype(state.dtype)
    return mx.concatenate(ys, axis=0).astype(x.dtype), state


def _float32_rows(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                  repeat: int) -> tuple[mx.array, ...]:
    """The gated rule's inputs in float32, q and k repeated to one key head per value
    head."""
    q32, k32 = (mx.repeat(a.astype(mx.float32), repeat, axis=1) for a in (q, k))
    return (q32, k32, *(a.astype(mx.float32) for a in (v, g, beta)))


def gated_delta_ref(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                    state: mx.array, state_slots: mx.array, cu_seqlens: mx.array,
                    has_state: mx.array, *, delta: bool = True) -> tuple[mx.array, mx.array]:
    """The gated delta rule (Gated DeltaNet's recurrence) over a packed batch, each
    sequence continuing from its state slot, token by token in float32.

    q, k [T, Hk, Dk] (normalised as the family does); v [T, Hv, Dv], Hv a multiple of Hk;
    g [T, Hv] or [T, Hv, Dk]: the decay; beta [T, Hv]; state [num_slots, Hv, Dv, Dk]
    float32; state_slots, cu_seqlens, has_state as short_conv_ref's.
    Per token: S = S * g; S = S + outer((v - S k) * beta, k); y = S q. With
    delta=False (Mamba2's gated linear attention): S = S * g; S = S + outer(v * beta, k).
    Returns (y [T, Hv, Dv] in q's dtype, state with each slot's final S).
    """
    heads = v.shape[1]
    repeat = heads // q.shape[1]
    q32, k32, v32, g32, b32 = _float32_rows(q, k, v, g, beta, repeat)
    cu = [int(c) for c in cu_seqlens.tolist()]
    ys, state = [], mx.array(state)  # a copy: the caller's array stays as it was
    for n, slot in enumerate(int(s) for s in state_slots.tolist()):
        s = state[slot] if bool(has_state[n].item()) else mx.zeros_like(state[slot])
        for t in range(cu[n], cu[n + 1]):
            decay = g32[t][:, None, None] if g32.ndim == 2 else g32[t][:, None, :]
            s = s * decay
            error = v32[t] - (s * k32[t][:, None, :]).sum(-1) if delta else v32[t]
            s = s + (error * b32[t][:, None])[:, :, None] * k32[t][:, None, :]
            ys.append((s * q32[t][:, None, :]).sum(-1))
        state[slot] = s
    return mx.stack(ys).astype(q.dtype), state


def _decay_ratios(g: mx.array) -> mx.array:
    """g [n, H] -> r [H, n, n], r[h, t, i] = prod_{i < s <= t} g[s, h] for i <= t (r[h, t, t]
    = 1), 0 above the diagonal: running products, never a quotient of cumulative ones (a
    gate of 0, or products that underflow, give zeros rather than 0 / 0)."""
    n = g.shape[0]
    idx = mx.arange(n)
    factors = mx.where(idx[:, None] < idx[None, :], g.T[:, None, :], 1.0)  # [H, i, s]
    ratios = mx.cumprod(factors, axis=-1)  # [H, i, t]: the product over i < s <= t
    return mx.where(idx[:, None] <= idx[None, :], ratios, 0.0).transpose(0, 2, 1)


def _chunk(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, s: mx.array,
           delta: bool) -> tuple[mx.array, mx.array]:
    """One chunk of n rows from state s [H, Dv, Dk] (q, k [n, H, Dk], v [n, H, Dv], g, beta
    [n, H], float32) -> (y [n, H, Dv], the state after its last row)."""
    r = _decay_ratios(g)
    gamma = mx.cumprod(g, axis=0).T[:, :, None]  # [H, n, 1]
    b = beta.T[:, :, None]
    kh, qh, vh = (a.transpose(1, 0, 2) for a in (k, q, v))
    st = s.transpose(0, 2, 1)
    if delta:
        # (I + A) D = diag(beta) (V - diag(gamma) K S^T), A[t, i] = beta_t r(t, i) k_t . k_i.
        n = g.shape[0]
        lower = mx.tril(b * r * (kh @ kh.transpose(0, 2, 1)), k=-1) + mx.eye(n)
        d = mx.linalg.solve_triangular(lower, b * (vh - gamma * (kh @ st)), upper=False,
                                       stream=mx.cpu)
    else:
        d = b * vh
    y = gamma * (qh @ st) + (r * (qh @ kh.transpose(0, 2, 1))) @ d
    s = gamma[:, -1:, :] * s + (r[:, -1, :, None] * d).transpose(0, 2, 1) @ kh
    return y.transpose(1, 0, 2), s


def gated_delta_chunked_ref(q: mx.array, k: mx.array, v: mx.array, g: mx.array,
                            beta: mx.array, state: mx.array, state_slots: mx.array,
                            cu_seqlens: mx.array, has_state: mx.array, *, chunk: int = 64,
                            delta: bool = True) -> tuple[mx.array, mx.array]:
    """gated_delta_ref's result by the chunked (WY) form, in float32: each sequence's rows
    in chunks of `chunk` from its first (the last shorter). Within a chunk from state S0,
    with r(t, i) the gates' product over (i, t] and gamma_t over [0, t]:
      (I + A) D = diag(beta) (V - diag(gamma) K S0^T), A[t, i] = beta_t r(t, i) k_t . k_i
      (i < t); D = diag(beta) V with delta=False
      y_t = gamma_t S0 q_t + sum_{i <= t} r(t, i) (k_i . q_t) d_i
      S = gamma_last S0 + sum_i r(last, i) d_i k_i^T
    Arguments and result as gated_delta_ref's; a vector gate g [T, Hv, Dk] has no chunked
    form here and goes token by token."""
    if g.ndim == 3:
        return gated_delta_ref(q, k, v, g, beta, state, state_slots, cu_seqlens, has_state,
                               delta=delta)
    repeat = v.shape[1] // q.shape[1]
    q32, k32, v32, g32, b32 = _float32_rows(q, k, v, g, beta, repeat)
    cu = [int(c) for c in cu_seqlens.tolist()]
    ys, state = [], mx.array(state)  # a copy: the caller's array stays as it was
    for n, slot in enumerate(int(s) for s in state_slots.tolist()):
        s = state[slot] if bool(has_state[n].item()) else mx.zeros_like(state[slot])
        for a in range(cu[n], cu[n + 1], chunk):
            rows = slice(a, min(a + chunk, cu[n + 1]))
            y, s = _chunk(q32[rows], k32[rows], v32[rows], g32[rows], b32[rows], s, delta)
            ys.append(y)
        state[slot] = s
    y = mx.concatenate(ys) if ys else mx.zeros((0, *v.shape[1:]))
    return y.astype(q.dtype), state


def short_conv_pages_ref(x: mx.array, weight: mx.array, lo: mx.array, slots: mx.array,
                         cu_seqlens: mx.array, has_state: mx.array,
                         conv_offset: int = 0) -> tuple[mx.array, mx.array]:
    """short_conv_ref with the states in cache pages (attention/caches/state_pages.py):
    lo [num_blocks, half_floats] float32, sequence n's state at
    lo[slots[n], conv_offset:][:(K-1)*C] as [K - 1, C]. Returns (y [T, C], a new lo)."""
    kernel, channels = weight.shape[1], x.shape[1]
    begin, end = conv_offset, conv_offset + (kernel - 1) * channels
    idx = slots.astype(mx.int32)
    states = lo[idx, begin:end].reshape(-1, kernel - 1, channels)
    y, states = short_conv_ref(x, weight, states, mx.arange(idx.shape[0]), cu_seqlens, has_state)
    lo = mx.array(lo)
    lo[idx, begin:end] = states.reshape(-1, end - begin)
    return y, lo


def gated_delta_pages_ref(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                          lo: mx.array, hi: mx.array, slots: mx.array, cu_seqlens: mx.array,
                          has_state: mx.array, ssm_offset: int, heads_in_lo: int, *,
                          delta: bool = True,
                          chunk: int = 0) -> tuple[mx.array, mx.array, mx.array]:
    """gated_delta_ref (gated_delta_chunked_ref for chunk > 0) with the states in cache
    pages: head h < heads_in_lo at lo[slot, ssm_offset + h * Dv * Dk], the rest at
    hi[slot, (h - heads_in_lo) * Dv * Dk], each [Dv, Dk] float32. Returns (y [T, Hv, Dv],
    new lo, new hi)."""
    heads, dv, dk = v.shape[1], v.shape[2], q.shape[2]
    per = dv * dk
    idx = slots.astype(mx.int32)
    n_lo, n_hi = heads_in_lo, heads - heads_in_lo
    parts = [lo[idx, ssm_offset:ssm_offset + n_lo * per].reshape(-1, n_lo, dv, dk),
             hi[idx, :n_hi * per].reshape(-1, n_hi, dv, dk)]
    states = mx.concatenate(parts, axis=1)
    slots_in_states = mx.arange(idx.shape[0])
    if chunk:
        y, states = gated_delta_chunked_ref(q, k, v, g, beta, states, slots_in_states,
                                            cu_seqlens, has_state, chunk=chunk, delta=delta)
    else:
        y, states = gated_delta_ref(q, k, v, g, beta, states, slots_in_states, cu_seqlens,
                                    has_state, delta=delta)
    lo, hi = mx.array(lo), mx.array(hi)
    lo[idx, ssm_offset:ssm_offset + n_lo * per] = states[:, :n_lo].reshape(-1, n_lo * per)
    if n_hi:
        hi[idx, :n_hi * per] = states[:, n_lo:].reshape(-1, n_hi * per)
    return y, lo, hi
