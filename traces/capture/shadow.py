"""The full-cache shadow pass: the unmodified model over the same token sequence, keeping only what the
retained-mass measure needs.

One forward pass over prompt + generated tokens with a registered attention function that computes the
layer's output normally and, for the last `rows` query positions only, the full-cache attention
probabilities (fp32, mean over the query heads of each KV group). Memory stays at rows x sequence per
layer instead of the sequence x sequence matrices `output_attentions=True` would keep for every layer.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

ATTENTION_NAME = "kvsim_shadow"
_recorder: ShadowRecorder | None = None  # the recorder of the pass in progress (passes do not nest)


class ShadowRecorder:
    def __init__(self, rows: int):
        self.rows = rows
        self.probs: dict[int, torch.Tensor] = {}  # layer -> (n_kv_heads, rows, seq) fp32


def _shadow_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager-equivalent attention that also records the last rows' probabilities per KV head."""
    batch, n_heads, q_len, head_dim = query.shape
    n_kv = key.shape[1]
    groups = n_heads // n_kv
    scaling = head_dim ** -0.5 if scaling is None else scaling
    key_rep = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    value_rep = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    mask = attention_mask[..., : key.shape[-2]] if attention_mask is not None else None
    out = F.scaled_dot_product_attention(query, key_rep, value_rep, attn_mask=mask,
                                         is_causal=mask is None and q_len > 1, scale=scaling)
    recorder = _recorder
    if recorder is not None:
        rows = min(recorder.rows, q_len)
        logits = torch.matmul(query[:, :, -rows:].float(), key_rep.transpose(2, 3).float()) * scaling
        if mask is not None:
            logits = logits + mask[:, :, -rows:].float()
        elif q_len > 1:
            causal = torch.ones(rows, key.shape[-2], dtype=torch.bool, device=query.device).tril(key.shape[-2] - rows)
            logits = logits.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(logits, dim=-1)  # (B, H, rows, S)
        per_kv = probs.view(batch, n_kv, groups, rows, -1).mean(dim=2)
        recorder.probs[module.layer_idx] = per_kv[0]
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION_NAME, _shadow_attention)
    # Without a mask function transformers passes no mask at all (bidirectional attention).
    AttentionMaskInterface.register(ATTENTION_NAME, eager_mask)


@contextlib.contextmanager
def _attention(model, name: str):
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@torch.no_grad()
def full_cache_attention(model, token_ids: list[int], rows: int, device) -> dict[int, torch.Tensor]:
    """Full-cache probabilities of the last `rows` queries: layer -> (n_kv_heads, rows, len(token_ids)).

    Positions are the original ones (0..len-1), as the policies under test keep them.
    """
    return _run(model, rows, input_ids=torch.tensor([token_ids], device=device), use_cache=False)


def _run(model, rows: int, **kwargs) -> dict[int, torch.Tensor]:
    global _recorder
    _register()
    recorder = ShadowRecorder(rows)
    _recorder = recorder
    try:
        with _attention(model, ATTENTION_NAME):
            model(**kwargs)
    finally:
        _recorder = None
    n_layers = model.config.num_hidden_layers
    if len(recorder.probs) != n_layers:
        raise RuntimeError(f"shadow pass saw {len(recorder.probs)} of {n_layers} attention layers: this "
                           f"architecture does not route attention through transformers' AttentionInterface")
    return recorder.probs


def _cache_kw(model) -> str:
    from keyformer.compat import (
        cache_kwarg_name,  # `cache` on transformers >= 5.24, else past_key_values
    )

    return cache_kwarg_name(model)


class PromptShadow:
    """The full-cache pass of one prompt, reused by every run on it: the prompt is processed once, and
    each run only pushes its own generated tokens through a copy of the prompt's (full) cache. That is
    the same computation as one pass over prompt + generated tokens, at a fraction of the cost."""

    def __init__(self, model, prompt: list[int], device):
        from transformers import DynamicCache

        self.model, self.device, self.n = model, device, len(prompt)
        self.cache = DynamicCache()
        _register()
        with torch.no_grad(), _attention(model, ATTENTION_NAME):
            model(input_ids=torch.tensor([prompt], device=device), use_cache=True, **{_cache_kw(model): self.cache})

    @torch.no_grad()
    def attention(self, generated: list[int]) -> dict[int, torch.Tensor]:
        """layer -> (n_kv_heads, len(generated), n + len(generated)): the rows of the generated tokens."""
        import copy

        cache = copy.deepcopy(self.cache)
        return _run(self.model, len(generated), input_ids=torch.tensor([generated], device=self.device),
                    use_cache=True, **{_cache_kw(self.model): cache})
