"""How a policy gets inside a model: one registered attention function (plus its mask function), one
forward pre-hook on the model, and for MPT (hand-written ALiBi attention that bypasses the interface) a
replacement of its attention modules' forward, scoped to `apply_policy`'s context.

The attention function computes the model's ordinary softmax attention over the slots and hands the fp32
logits and probabilities to the policy, which accumulates its scores and evicts right after the layer's
attention, so no extra pass over K/V is needed.
"""
from __future__ import annotations

import contextlib
import types

import torch

from keyformer import compat
from keyformer.cache import SlotLayer

ATTENTION_NAME = "kvsim_slots"


# ---- the attention math shared by every architecture ----------------------------------------------------
def slot_bias(layer: SlotLayer) -> torch.Tensor:
    """(B, H_kv, 1, S) additive fp32 bias hiding the empty slots of a decode step."""
    return torch.where(layer.positions >= 0, 0.0, torch.finfo(torch.float32).min).unsqueeze(2)


def attend(policy, layer: SlotLayer, query, key, value, bias, scaling: float):
    """Softmax attention of query (B, H_q, q, D) over key/value (B, H_kv, S, D) with an additive bias of
    shape (B, 1 | H_kv, q | 1, S); returns the output (B, q, H_q, D) and probabilities (B, H_q, q, S).

    GQA without `repeat_kv`: the G query heads of a KV group are folded into the query axis, so K/V are
    read once per KV head. Logits and softmax are fp32 (as the eager paths of Llama/GPT-J/MPT do).
    """
    batch, q_heads, q_len, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    group = q_heads // kv_heads
    grouped = query.reshape(batch, kv_heads, group * q_len, dim)
    logits = torch.matmul(grouped, key.transpose(-1, -2)).float().mul_(scaling)
    logits = logits.view(batch, kv_heads, group, q_len, slots)
    if bias is not None:
        logits = logits + bias.unsqueeze(2).float()
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs.to(value.dtype).view(batch, kv_heads, group * q_len, slots), value)
    out = out.view(batch, q_heads, q_len, value.shape[-1]).transpose(1, 2)
    if layer is not None:
        policy.observe_attention(layer, logits, probs)
    return out, probs.view(batch, q_heads, q_len, slots)


def slot_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The function registered in transformers' AttentionInterface under ATTENTION_NAME."""
    policy = module._kvsim_policy
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    layer = policy.layers[module.layer_idx] if policy.layers else None
    if layer is None or not layer.is_initialized:
        raise ValueError("attention ran without the policy's cache (use_cache=False?)")
    if layer.in_prefill:
        bias = attention_mask  # sliding layers: transformers' own sliding-window causal mask over the prompt
    else:  # every slot is filled during a decode step when the batch shares one budget
        # (a sliding layer holds exactly the window, so the stock window mask is its empty-slot mask)
        bias = None if policy.dense_slots and layer.window is None else slot_bias(layer)
    return attend(policy, layer, query, key, value, bias, scaling)


def slot_mask(*, q_length: int, **kwargs):
    """Mask function registered with the attention function: the prompt gets transformers' own eager causal
    + padding mask; a decode step gets none, because slot order is not token order and the attention
    function masks empty slots itself (the 2-D padding mask no longer lines up with the slots)."""
    if q_length == 1:
        return None
    return compat.eager_mask(q_length=q_length, **kwargs)


compat.register_attention(ATTENTION_NAME, slot_attention, slot_mask)


# ---- MPT: ALiBi gathered by the original positions of the slots -----------------------------------------
def alibi_slopes(model, n_heads: int, device) -> torch.Tensor:
    """MPT's per-head ALiBi slopes, read off its own bias builder (bias = slope * (j - (L - 1)))."""
    alibi_max = model.config.attn_config.alibi_bias_max
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
    bias = build_mpt_alibi_tensor(n_heads, 2, alibi_max, device=device)  # (H, 1, 2): [-slope, 0]
    return -bias[:, 0, 0].float()


def _slot_ranks(positions: torch.Tensor) -> torch.Tensor:
    """Rank of each slot's token among the held ones (renumbered positions), empty slots -1."""
    order = torch.where(positions >= 0, positions, torch.iinfo(torch.long).max).argsort(dim=-1)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device)
                                             .expand_as(order).contiguous())
    return torch.where(positions >= 0, ranks, -1)


def mpt_attention_forward(self, hidden_states, position_bias=None, *args, **kwargs):
    """Replacement for MptAttention.forward under a policy (same projections; bias from slot positions).

    ALiBi only depends on the key's position up to a per-row constant (softmax is shift-invariant), so the
    bias of a kept token is slope * original_position, whatever slot it sits in.
    """
    policy = self._kvsim_policy
    cache = compat.get_cache(kwargs)
    attention_mask = kwargs.get("attention_mask")
    if cache is None:
        raise ValueError("MPT under a KV policy needs use_cache=True (MptConfig defaults to False)")
    batch, q_len = hidden_states.shape[:2]
    mixed = self.Wqkv(hidden_states)
    if self.clip_qkv:
        mixed = mixed.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    query, key, value = (t.reshape(batch, q_len, self.n_heads, self.head_dim).transpose(1, 2)
                         for t in mixed.chunk(3, dim=2))
    key, value = cache.update(key, value, self.layer_idx)
    layer = policy.layers[self.layer_idx]
    slopes = self._kvsim_slopes.view(1, self.n_heads, 1, 1)
    if layer.in_prefill:
        key_pos = policy.prompt_positions.to(key.device).view(batch, 1, 1, -1).float()
        bias = slopes * key_pos
        if attention_mask is not None:  # MPT's mask is boolean, True = masked
            bias = bias.masked_fill(attention_mask.bool(), torch.finfo(torch.float32).min)
    else:
        key_pos = layer.positions if policy.position_mode == "original" else _slot_ranks(layer.positions)
        bias = slopes * key_pos.unsqueeze(2).float()
        if not policy.dense_slots:
            bias = bias + slot_bias(layer)
    out, probs = attend(policy, layer, query, key, value, bias, self.softmax_scale)
    return self.out_proj(out.reshape(batch, q_len, -1)), probs


HANDWRITTEN_ATTENTION = {"mpt": {"forward": mpt_attention_forward}}


def attention_patches(model) -> dict:
    """{method name: replacement} for architectures whose attention bypasses AttentionInterface."""
    return HANDWRITTEN_ATTENTION.get(model.config.model_type) or compat.legacy_attention_patches(model, slot_attention)


# ---- applying a policy to a model ------------------------------------------------------------------------
def attention_modules(model) -> dict[int, torch.nn.Module]:
    """Self-attention modules by layer index (modules named *Attention that carry a layer_idx)."""
    found: dict[int, torch.nn.Module] = {}
    for module in model.modules():
        if (type(module).__name__.endswith("Attention") and getattr(module, "layer_idx", None) is not None
                and not getattr(module, "is_cross_attention", False)):
            found.setdefault(int(module.layer_idx), module)
    if not found or sorted(found) != list(range(len(found))):
        raise ValueError(f"could not find one self-attention module per layer in {type(model).__name__}")
    return found


def layer_windows(config, n_layers: int) -> list[int | None]:
    """Per layer, the sliding attention window (tokens a query attends to, itself included) or None for a
    full-attention (global) layer: the config's `layer_types` where it has them (Gemma 3: five
    "sliding_attention" layers per "full_attention" one; Qwen2 derives them from use_sliding_window), else
    `sliding_window` on every layer (Mistral). Other layer types (chunked attention) are refused."""
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if layer_types:
        if len(layer_types) != n_layers:
            raise ValueError(f"{config.model_type}: {len(layer_types)} layer_types for {n_layers} attention layers")
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"{config.model_type}: layer types {', '.join(unknown)} are not supported by the KV "
                             "policies (only full_attention and sliding_attention)")
        windows = [window if t == "sliding_attention" else None for t in layer_types]
        if any(t == "sliding_attention" for t in layer_types) and window is None:
            raise ValueError(f"{config.model_type}: sliding_attention layers without a sliding_window")
    else:
        windows = [window] * n_layers
    for w in windows:
        if w is not None and (not isinstance(w, int) or w < 2):
            raise ValueError(f"{config.model_type}: sliding_window must be an integer >= 2, got {w!r}")
    return windows


def check_supported(model) -> None:
    compat.check_version()
    config = model.config
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ValueError(f"{config.model_type}: attention logit soft-capping (attn_logit_softcapping="
                         f"{config.attn_logit_softcapping}) is not supported by the KV policies")
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError(f"{config.model_type}: bidirectional attention is not supported by the KV policies")
    generation = getattr(model, "generation_config", None)
    if generation is not None and getattr(generation, "cache_implementation", None) not in (None, "dynamic"):
        raise ValueError(f"cache_implementation={generation.cache_implementation!r} is not supported: "
                         "the KV policies need the dynamic cache")
    if not attention_patches(model) and not model._can_set_attn_implementation():
        raise ValueError(f"{config.model_type}: attention does not go through transformers' AttentionInterface")


def position_scheme(config) -> str:
    """How the architecture encodes positions: "alibi" (MPT), "learned" (absolute embeddings added to the
    input: GPT-2, OPT) or "rope" (rotary, applied to each cached key at the position it was computed with)."""
    if config.model_type == "mpt" or getattr(config, "alibi", False):
        return "alibi"
    if config.model_type in ("gpt2", "opt", "gpt_bigcode", "biogpt"):
        return "learned"
    return "rope"


def check_positions(policy, model) -> None:
    """Renumbered positions give the query position k while RoPE keys keep the rotation of their original
    position: the relative offsets the model sees would be neither the original nor the in-cache ones.
    StreamingLLM re-rotates the cached keys instead; this implementation does not, so it refuses."""
    if policy.position_mode == "renumber" and policy.evicts and position_scheme(model.config) == "rope":
        raise ValueError(f"position_mode='renumber' is not supported on {model.config.model_type} (RoPE): the "
                         "cached keys keep their original rotations, so only the query would move; use "
                         "position_mode='original' (ALiBi and learned-position models support 'renumber')")


def install_slot_layers(policy, cache, n_layers: int) -> None:
    """Turn an empty transformers cache into the policy's slot cache (same object: generate keeps it)."""
    if type(cache) not in (compat.DynamicCache, compat.Cache):
        raise ValueError(f"{type(cache).__name__} is not supported: the KV policies need a plain DynamicCache")
    for layer in cache.layers:
        if type(layer) not in (compat.DynamicLayer, compat.DynamicSlidingWindowLayer, SlotLayer):
            raise ValueError(f"{type(layer).__name__} layers are not supported: the KV policies need plain "
                             "dynamic (full-attention or sliding-window) layers")
    if cache.get_seq_length() > 0:
        raise ValueError("the cache already holds tokens that were not prefilled under this policy")
    windows = policy.layer_windows or [None] * n_layers
    if len(windows) != n_layers:
        raise ValueError(f"the policy was applied to a model of {len(windows)} layers, not {n_layers}")
    cache.layers = [SlotLayer(policy, i, window=windows[i]) for i in range(n_layers)]
    cache.layer_class_to_replicate = None
    policy.layers = cache.layers
    policy._cache = cache


def _before_forward(policy, n_layers: int, cache_name: str, takes_positions: bool, args, kwargs):
    """Forward pre-hook: install the slot cache at the prompt, and feed explicit position ids."""
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    inputs = input_ids if input_ids is not None else kwargs.get("inputs_embeds")
    if inputs is None:
        raise ValueError("the model was called without input_ids or inputs_embeds")
    if kwargs.get("use_cache") is False:
        raise ValueError("a KV policy needs use_cache=True (MptConfig, for one, defaults to use_cache=False)")
    batch, q_len = inputs.shape[:2]
    cache = compat.get_cache(kwargs)
    is_decode = (cache is not None and cache is policy._cache and policy.layers
                 and policy.layers[0].is_initialized)
    if is_decode:
        if q_len != 1:
            raise ValueError(f"under a KV policy each step after the prompt takes one token, got {q_len}")
        position_ids = policy.next_positions()
    else:
        if cache is None:
            cache = compat.DynamicCache()
        install_slot_layers(policy, cache, n_layers)
        mask = kwargs.get("attention_mask")
        if mask is None:
            mask = torch.ones(batch, q_len, dtype=torch.long, device=inputs.device)
        if mask.dim() != 2 or mask.shape[1] != q_len:
            raise ValueError("the prompt needs a 2-D attention mask covering exactly the prompt tokens")
        position_ids = policy.start_prompt(mask, inputs)
    if takes_positions:
        kwargs["position_ids"] = position_ids.to(inputs.device)
    compat.set_cache(kwargs, cache, cache_name)
    kwargs["use_cache"] = True
    return args, kwargs


def _schedule_aware_generate(policy, generate):
    """model.generate that hands the requested number of new tokens (T) to Keyformer's tau schedule."""
    def wrapped(*args, **kwargs):
        if getattr(policy, "max_new_tokens", 0) is not None:
            return generate(*args, **kwargs)
        config = kwargs.get("generation_config") or generate.__self__.generation_config
        total = kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None))
        if total is None:
            inputs = kwargs.get("input_ids", args[0] if args else None)
            max_length = kwargs.get("max_length", getattr(config, "max_length", None))
            if inputs is not None and max_length is not None:
                total = max_length - inputs.shape[-1]
        policy.max_new_tokens = total
        try:
            return generate(*args, **kwargs)
        finally:
            policy.max_new_tokens = None
    return wrapped


@contextlib.contextmanager
def apply_policy(policy, model):
    """Route `model`'s attention through `policy` for the duration of the context."""
    if policy._applied_to is not None:
        raise ValueError("this policy is already applied to a model")
    check_supported(model)
    check_positions(policy, model)
    if model.training:
        raise ValueError("KV policies are for inference: call model.eval() first (attention dropout is not applied)")
    modules = attention_modules(model)
    windows = layer_windows(model.config, len(modules))
    if any(w is not None for w in windows) and position_scheme(model.config) == "alibi":
        raise ValueError(f"{model.config.model_type}: sliding-window layers with ALiBi are not supported")
    patches = attention_patches(model)
    previous = model.config._attn_implementation
    cache_name = compat.cache_kwarg_name(model)
    takes_positions = compat.accepts_kwarg(model, "position_ids")
    hook = model.register_forward_pre_hook(
        lambda mod, args, kwargs: _before_forward(policy, len(modules), cache_name, takes_positions, args, kwargs),
        with_kwargs=True)
    try:
        for module in modules.values():
            module._kvsim_policy = policy
            if model.config.model_type == "mpt":
                module._kvsim_slopes = alibi_slopes(model, module.n_heads, next(model.parameters()).device)
            for method, replacement in patches.items():
                setattr(module, method, types.MethodType(replacement, module))
        if not patches:
            model.set_attn_implementation(ATTENTION_NAME)
        model.generate = _schedule_aware_generate(policy, model.generate)
        policy._applied_to = model
        policy.layer_windows = windows
        yield policy
    finally:
        hook.remove()
        for module in modules.values():
            for attr in ("_kvsim_policy", "_kvsim_slopes", *patches):
                module.__dict__.pop(attr, None)
        model.__dict__.pop("generate", None)
        if not patches and model.config._attn_implementation != previous:
            model.set_attn_implementation(previous)
        policy._applied_to = None
