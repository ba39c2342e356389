"""What the adapter reads off a model, and what it refuses by name."""

import mlx.core as mx
import mlx.nn as nn
import pytest

from tests.family_models import WINDOW, cached_family_model
from tests.tiny_models import cached_tiny_model
from vllm_metal.backend import select_backend
from vllm_metal.models.adapter import ModelAdapter, UnsupportedModelError
from vllm_metal.v1.model_lifecycle import load_model


def _adapter(family: str) -> ModelAdapter:
    return load_model(str(cached_family_model(family)), mx.float32, select_backend()).adapter


def test_sliding_window_layers_are_found_from_the_mask_the_family_asks_for():
    # gemma3_text decides per layer from its own pattern; cohere2 from
    # use_sliding_window; the adapter reads neither attribute.
    for family in ("gemma3_text", "cohere2", "olmo3", "ministral3"):
        windows = [e.window for e in _adapter(family).entries]
        assert windows == [WINDOW, None, WINDOW, None], family


def test_kv_shared_layers_have_no_entry_of_their_own():
    # Gemma 4: six layers, the last two reuse earlier layers' K/V.
    adapter = _adapter("gemma4_text")
    assert len(adapter.backbone.layers) == 6
    assert len(adapter.entries) == 4


def test_scale_and_softcap_are_the_ones_the_layer_attends_with():
    gemma2 = _adapter("gemma2")
    assert gemma2.entries[0].scale == pytest.approx(48 ** -0.5)
    assert gemma2.entries[0].softcap == pytest.approx(5.0)
    granite = _adapter("granite")
    assert granite.entries[0].scale == pytest.approx(0.05)   # attention_multiplier


def test_head_transforms_are_the_family_own():
    # A head with nothing after it may take the fused argmax; a scaled or
    # soft-capped one may not.
    assert _adapter("llama").plain_head is not None
    for family in ("granite", "gemma2", "cohere", "minicpm"):
        assert _adapter(family).plain_head is None, family
    neox = _adapter("gpt_neox")
    assert neox.head_in_backbone and neox.vocab_size == 1024


@pytest.mark.parametrize("family", ["granite", "gemma2", "cohere", "minicpm", "gemma4_text",
                                    "gpt_neox", "internlm2", "gpt_bigcode"])
def test_family_logits_match_the_model_own_call(family):
    # The model's own dense forward against its own backbone + the adapter's head.
    from mlx_lm.utils import load_model as mlx_load

    model, _ = mlx_load(cached_family_model(family))
    ids = mx.array([[5, 17, 300, 42]], dtype=mx.int32)
    want = model(ids)[0]
    backbone = model.transformer if family == "gpt_bigcode" else model.model
    hidden = backbone(ids)[0]   # no cache: mlx-lm's dense path, before the adapter's swaps
    mx.eval(want, hidden)
    got = ModelAdapter(model).logits(hidden)
    assert got.shape == want.shape
    assert mx.allclose(got, want, rtol=1e-5, atol=1e-5).item()


class _SelfComputing(nn.Module):
    """Attention that stores through the cache but computes its scores itself."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __call__(self, x, mask=None, cache=None):
        a = self.inner
        rows, length, _ = x.shape
        k = a.k_proj(x).reshape(rows, length, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = a.v_proj(x).reshape(rows, length, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        keys, values = cache.update_and_fetch(k, v)
        return a.o_proj(mx.zeros((rows, length, a.n_heads * k.shape[-1])))


def _llama():
    from mlx_lm.utils import load_model as mlx_load

    model, _ = mlx_load(cached_tiny_model("llama"))
    return model


def test_attention_computed_outside_sdpa_is_refused_naming_the_layer():
    model = _llama()
    model.model.layers[1].self_attn = _SelfComputing(model.model.layers[1].self_attn)
    with pytest.raises(UnsupportedModelError, match=r"layer 1's attention .*_SelfComputing.* "
                                                    "computes attention itself"):
        ModelAdapter(model)


def test_a_mask_of_the_family_own_making_is_refused():
    model = _llama()
    backbone = type(model.model)
    original = backbone.__call__

    def with_own_mask(self, inputs, cache=None, input_embeddings=None):
        h = self.embed_tokens(inputs)
        mask = mx.ones((h.shape[1], h.shape[1]), dtype=mx.bool_)
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        return self.norm(h)

    backbone.__call__ = with_own_mask
    try:
        with pytest.raises(UnsupportedModelError, match="mask of its own"):
            ModelAdapter(model)
    finally:
        backbone.__call__ = original


def test_a_cache_kind_other_than_kv_is_refused_naming_it():
    from mlx_lm.models.cache import ArraysCache

    model = _llama()
    model.make_cache = lambda: [ArraysCache(2) for _ in model.model.layers]
    with pytest.raises(UnsupportedModelError, match="ArraysCache"):
        ModelAdapter(model)


def test_a_rotating_cache_that_keeps_sink_tokens_is_refused():
    from mlx_lm.models.cache import RotatingKVCache

    model = _llama()
    model.make_cache = lambda: [RotatingKVCache(64, keep=4) for _ in model.model.layers]
    with pytest.raises(UnsupportedModelError, match="keeping 4 tokens"):
        ModelAdapter(model)


def test_layers_with_different_kv_shapes_are_refused_at_load():
    # Gemma 4's global layers may have their own head size; one paged shape is kept.
    path = cached_family_model("gemma4_text", global_head_dim=128)
    with pytest.raises(UnsupportedModelError, match=r"gemma4_text: its layers differ"):
        load_model(str(path), mx.float32, select_backend())



def test_phi3small_block_sparse_attention_is_refused_by_name():
    # Its attention adds an array mask of its own (block-sparse); kept out of the
    # sweep because its own forward crashes MLX's CPU backend now and then.
    import importlib

    from tests.models.test_family_sweep import _config

    module = importlib.import_module("mlx_lm.models.phi3small")
    model = module.Model(module.ModelArgs.from_dict(_config(module)))
    with pytest.raises(UnsupportedModelError, match=r"^phi3small: .*mask as an array"):
        ModelAdapter(model)


def test_latent_attention_caches_one_row_per_token():
    """MLA layers (DeepSeek-V3 shape) cache [latent, k_pe] rows: one KV head of
    rank + rope_dim, no values; vLLM gets its MLA spec, half a K/V page."""
    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.attention.latent_attention import LatentAttention
    from vllm_metal.v1.model_lifecycle import derive_dims

    loaded = load_model(str(cached_family_model("deepseek_v3")), mx.float32, select_backend())
    entries = loaded.adapter.entries
    assert {(e.num_kv_heads, e.head_dim, e.latent_rank) for e in entries} == {(1, 64 + 32, 64)}
    assert all(isinstance(layer.self_attn, LatentAttention) for layer in loaded.model.model.layers)
    dims = derive_dims(loaded.adapter)
    assert dims.latent and (dims.num_kv_heads, dims.head_dim) == (1, 96)
    cache = PagedKVCache(dims.num_layers, 5, 16, 1, 96, mx.float32, latent=True)
    assert cache.value_caches == [None] * dims.num_layers
    assert cache.nbytes == dims.num_layers * 5 * 16 * 96 * 4 == PagedKVCache.bytes_per_block(
        dims.num_layers, 16, 1, 96, mx.float32, latent=True) * 5
    cache.copy_blocks([1], [2])
    cache.zero_blocks([3])
    assert cache.value_caches == [None] * dims.num_layers


def test_latent_attention_that_the_wrapper_does_not_reproduce_is_refused_by_name():
    from mlx_lm.models import deepseek_v3

    class Doubled(deepseek_v3.DeepseekV3Attention):
        def __call__(self, x, mask=None, cache=None):
            return 2 * super().__call__(x, mask, cache)

    from mlx_lm.utils import load_model as mlx_load

    model, _ = mlx_load(cached_family_model("deepseek_v3"))
    for layer in model.model.layers:
        layer.self_attn.__class__ = Doubled
    with pytest.raises(UnsupportedModelError, match=r"deepseek_v3: .*Doubled: the paged latent "
                                                    r"attention differs"):
        ModelAdapter(model)


def test_latent_attention_whose_own_forward_fails_the_check_is_refused_by_name():
    """A module of the MLA shape whose call the check cannot make (an argument it does
    not know) is refused naming it, not a crash at load."""
    from mlx_lm.models import deepseek_v3
    from mlx_lm.utils import load_model as mlx_load

    class NeedsMore(deepseek_v3.DeepseekV3Attention):
        def __call__(self, x, extra, mask=None, cache=None):
            return super().__call__(x, mask, cache)

    model, _ = mlx_load(cached_family_model("deepseek_v3"))
    for layer in model.model.layers:
        layer.self_attn.__class__ = NeedsMore
    with pytest.raises(UnsupportedModelError, match=r"deepseek_v3: .*NeedsMore: its check "
                                                    r"failed \(TypeError"):
        ModelAdapter(model)


@pytest.mark.parametrize("family", ["deepseek_v2", "minicpm3"])
def test_expanded_latent_attention_is_cut_into_the_absorbed_pair(family):
    """mlx-lm's DeepSeek-V2 and MiniCPM3 keep kv_b_proj whole and cache expanded
    K/V; the wrapper cuts it per head (quantized rows stay quantized) and caches the
    latent rows instead; the family's kv_b_proj is gone, not kept beside the cut."""
    from vllm_metal.attention.latent_attention import LatentAttention

    for bits in (None, 4):
        path = cached_family_model(family, **({"quantize_bits": bits, "group_size": 32}
                                              if bits else {}))
        loaded = load_model(str(path), mx.float32, select_backend())
        assert {(e.num_kv_heads, e.latent_rank) for e in loaded.adapter.entries} == {(1, 64)}
        attention = loaded.model.model.layers[0].self_attn
        assert isinstance(attention, LatentAttention)
        assert "kv_b_proj" not in attention.inner
        assert ("scales" in attention.kv_b_uk) == (bits is not None)
