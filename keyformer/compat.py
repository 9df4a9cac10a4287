"""Everything that differs between the transformers versions we support (5.17 to 5.24), in one place.

- 5.24 renamed the cache kwarg of every `forward` from `past_key_values` to `cache` (the old name still
  works through `@deprecate_kwarg` until 5.40, and outputs keep a `.past_key_values` property).
- `cache_position` is gone since 5.5: masks are sized from the cache (`get_mask_sizes(query_length)`,
  `get_query_offset`) and nothing here relies on it.
- GPT-J computes attention in a hand-written `GPTJAttention._attn` up to 5.17 (it goes through
  `AttentionInterface` in 5.24): `legacy_attention_patches` routes that method to the slot attention.
- Attention functions and mask functions are registered through `AttentionInterface` and
  `AttentionMaskInterface`; their module paths are stable across 5.x.
"""
from __future__ import annotations

import inspect

import torch
import transformers
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
from transformers.masking_utils import AttentionMaskInterface, eager_mask

TRANSFORMERS_VERSION = transformers.__version__
SUPPORTED = ((5, 17), (5, 24))

__all__ = [
    "legacy_attention_patches",
    "AttentionInterface", "AttentionMaskInterface", "Cache", "CacheLayerMixin", "DynamicCache", "DynamicLayer",
    "DynamicSlidingWindowLayer",
    "TRANSFORMERS_VERSION", "cache_kwarg_name", "get_cache", "set_cache", "output_cache", "eager_mask",
    "check_version", "register_attention", "accepts_kwarg", "filled_dynamic_cache",
]


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def check_version() -> None:
    """Refuse a transformers outside the range whose cache/attention API this package was written against."""
    version = _version_tuple(TRANSFORMERS_VERSION)
    if not SUPPORTED[0] <= version <= SUPPORTED[1]:
        raise RuntimeError(
            f"keyformer supports transformers 5.17 to 5.24, found {TRANSFORMERS_VERSION}")


def cache_kwarg_name(model: torch.nn.Module) -> str:
    """Name under which `model.forward` takes the KV cache: `cache` (>= 5.24) or `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def get_cache(kwargs: dict):
    """The cache object among forward kwargs, whichever name the caller (generate, a user) used."""
    cache = kwargs.get("cache")
    return cache if cache is not None else kwargs.get("past_key_values")


def set_cache(kwargs: dict, cache, name: str) -> None:
    """Put `cache` under the model's own kwarg name and drop the other spelling (both would be ambiguous)."""
    kwargs.pop("cache", None)
    kwargs.pop("past_key_values", None)
    kwargs[name] = cache


def output_cache(outputs):
    """The cache carried by a model output (`.cache` on >= 5.24, `.past_key_values` before)."""
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else getattr(outputs, "past_key_values", None)


def accepts_kwarg(model: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def register_attention(name: str, attention_fn, mask_fn) -> None:
    """Register an attention function *and* its mask function under one name.

    Without the mask registration transformers' `_preprocess_mask_arguments` returns no mask at all, which
    silently turns causal attention bidirectional (shared/docs/transformers-kv-notes.md §2.3).
    """
    AttentionInterface.register(name, attention_fn)
    AttentionMaskInterface.register(name, mask_fn)


def filled_dynamic_cache(keys: list[torch.Tensor], values: list[torch.Tensor]) -> DynamicCache:
    """A stock `DynamicCache` already holding the given per-layer K/V (for baselines and benchmarks).

    `DynamicCache.update` on an empty layer stores the tensors as given, on every supported version.
    """
    cache = DynamicCache()
    for layer_idx, (k, v) in enumerate(zip(keys, values)):
        cache.update(k, v, layer_idx)
    return cache


def legacy_attention_patches(model, attention) -> dict:
    """{method name: replacement} for attention modules that, in this transformers version, compute attention
    by hand instead of through AttentionInterface (empty when the interface is used). `attention` is the
    attention function to route them to (keyformer.attention.slot_attention): passed in, so this module
    stays a leaf that imports nothing of keyformer."""
    if model.config.model_type == "gptj":
        from transformers.models.gptj import modeling_gptj
        if hasattr(modeling_gptj.GPTJAttention, "_attn"):
            return {"_attn": _gptj_legacy_attn(attention)}
    return {}


def _gptj_legacy_attn(attention):
    def _attn(self, query, key, value, attention_mask=None):
        """GPTJAttention._attn (<= 5.17): (B, H, q, D) in and out, logits / sqrt(head_dim)."""
        out, weights = attention(self, query, key, value, attention_mask, scaling=1.0 / self.scale_attn)
        return out.transpose(1, 2), weights
    return _attn
