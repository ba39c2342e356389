"""mlx-lm's forward with keys and values rounded as a quantized KV cache stores them:
the reference for ``--kv-cache-dtype fp8 / fp8_e5m2 / int8_per_token_head``.

Each (token, head) row of K and V passes through the independent numpy codec
(tests/ops/kv_quant_np.py: max|x| / largest code as the scale, the nearest code)
as mlx-lm's cache stores it; everything else is mlx-lm's own float32 forward.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
import numpy as np

from tests.ops.kv_quant_np import decoded_rows


def round_rows(x: mx.array, fmt: str) -> mx.array:
    """[..., D] -> the values a quantized cache reads back, in x's dtype."""
    rows = decoded_rows(np.array(x.astype(mx.float32)), fmt).astype(np.float32)
    return mx.array(rows).astype(x.dtype)


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
                return _fetch(self, round_rows(keys, fmt), round_rows(values, fmt))

            kind.update_and_fetch = rounded
        yield
    finally:
        for kind, fetch in saved:
            kind.update_and_fetch = fetch
