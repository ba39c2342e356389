"""mlx-lm's forward with keys and values rounded as a quantized KV cache stores them:
the reference for ``--kv-cache-dtype fp8 / fp8_e5m2 / int8_per_token_head /
turboquant_4bit_nc / turboquant_k8v4``.

Each (token, head) row of K and V passes through the independent numpy codec
(tests/ops/kv_quant_np.py: max|x| / largest code as the scale, the nearest code;
tests/ops/rotated_kv_np.py for ``rot4``: rotated Lloyd-Max keys, uniform values;
``k8v4``: e4m3 keys, those values) as
mlx-lm's cache stores it; everything else is mlx-lm's own float32 forward.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
import numpy as np

from tests.ops import rotated_kv_np
from tests.ops.kv_quant_np import decoded_rows


def round_rows(x: mx.array, fmt: str, keys: bool) -> mx.array:
    """[..., D] keys (or values) -> what a quantized cache reads back, in x's dtype."""
    x32 = np.array(x.astype(mx.float32))
    if fmt in ("rot4", "k8v4") and not keys:
        rows = rotated_kv_np.decode_values(rotated_kv_np.encode_values(x32, 4))
    elif fmt == "rot4":
        rows = rotated_kv_np.decode_keys(rotated_kv_np.encode_keys(x32, 4), 4, True)
    else:
        rows = decoded_rows(x32, "fp8_e4m3" if fmt == "k8v4" else fmt)
    return mx.array(rows.astype(np.float32)).astype(x.dtype)


@contextlib.contextmanager
def rounding_kv(fmt: str):
    """mlx-lm's KV caches store quantize-then-decode rows for the duration."""
    from mlx_lm.models import cache

    kinds = {c for c in vars(cache).values()
             if isinstance(c, type) and "update_and_fetch" in vars(c)
             and c.__name__ in ("KVCache", "RotatingKVCache", "ChunkedKVCache")}
    saved = [(kind, kind.update_and_fetch) for kind in kinds]
    try:
        for kind, fetch in saved:
            def rounded(self, keys, values, _fetch=fetch):
                return _fetch(self, round_rows(keys, fmt, True), round_rows(values, fmt, False))

            kind.update_and_fetch = rounded
        yield
    finally:
        for kind, fetch in saved:
            kind.update_and_fetch = fetch
