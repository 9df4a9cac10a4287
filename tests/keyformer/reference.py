"""Independent references: the stock model with a stock DynamicCache, and the masking simulation (full
cache, original positions, evicted keys hidden by an additive per-layer, per-head mask added to the
architecture's own eager attention)."""
from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from keyformer import compat

REFERENCE_NAME = "kvsim_test_reference"
EXTRA_MASKS: dict[int, torch.Tensor] = {}  # layer -> (B, H_q, 1, S) additive mask of the current step


def _reference_attention(module, query, key, value, attention_mask, **kwargs):
    stock = sys.modules[type(module).__module__].eager_attention_forward
    extra = EXTRA_MASKS.get(module.layer_idx)
    if extra is not None:
        attention_mask = extra if attention_mask is None else attention_mask + extra
    return stock(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(REFERENCE_NAME, _reference_attention)
AttentionMaskInterface.register(REFERENCE_NAME, eager_mask)


def _attention_modules(model):
    return {m.layer_idx: m for m in model.modules()
            if type(m).__name__.endswith("Attention") and getattr(m, "layer_idx", None) is not None}


@torch.no_grad()
def stock_logits(model, input_ids, tokens, attention_mask=None):
    """Stock eager model + DynamicCache: logits of the prompt's last position, then of each fed token."""
    name = compat.cache_kwarg_name(model)
    cache = DynamicCache()
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **{name: cache})
    logits = [out.logits[:, -1].float()]
    for token in tokens:
        out = model(input_ids=token, use_cache=True, **{name: cache})
        logits.append(out.logits[:, -1].float())
    return logits


@torch.no_grad()
def masked_reference_logits(model, input_ids, tokens, kept_by_step, group: int):
    """Decode-step logits of the masking simulation (batch 1, no padding).

    `kept_by_step[(s, layer)]` = (1, H_kv, k) original positions held after step s (s = -1: prefill);
    decode step s attends to kept_by_step[(s - 1, layer)] plus its own token, at original positions.
    """
    name = compat.cache_kwarg_name(model)
    prompt_len = input_ids.shape[1]
    modules = _attention_modules(model)
    is_mpt = model.config.model_type == "mpt"
    # Attention written by hand (MPT; GPT-J up to transformers 5.17): add the mask through the module's
    # own attention_mask argument (boolean for MPT, additive for GPT-J).
    by_hand = is_mpt or hasattr(type(modules[0]), "_attn")
    hooks = []
    previous = model.config._attn_implementation
    if by_hand:
        def hook(module, args, kwargs):
            extra = EXTRA_MASKS.get(module.layer_idx)
            if extra is not None:
                mask = kwargs.get("attention_mask")
                if is_mpt:
                    kwargs["attention_mask"] = mask | (extra < 0)
                else:
                    kwargs["attention_mask"] = extra if mask is None else mask + extra
            return args, kwargs
        hooks = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules.values()]
    else:
        model.set_attn_implementation(REFERENCE_NAME)
    try:
        cache = DynamicCache()
        EXTRA_MASKS.clear()
        model(input_ids=input_ids, use_cache=True, **{name: cache})
        logits = []
        for step, token in enumerate(tokens):
            length = prompt_len + step + 1
            for layer in modules:
                kept = kept_by_step[(step - 1, layer)][0]  # (H_kv, k)
                allowed = torch.zeros(kept.shape[0], length, dtype=torch.bool)
                allowed.scatter_(1, torch.where(kept >= 0, kept, length - 1), True)  # -1 pads: the newcomer
                allowed[:, length - 1] = True  # the newcomer
                mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
                EXTRA_MASKS[layer] = mask.repeat_interleave(group, dim=0)[None, :, None, :]
            out = model(input_ids=token, position_ids=torch.tensor([[length - 1]]), use_cache=True,
                        **{name: cache})
            logits.append(out.logits[:, -1].float())
        return logits
    finally:
        EXTRA_MASKS.clear()
        for h in hooks:
            h.remove()
        if not by_hand:
            model.set_attn_implementation(previous)
