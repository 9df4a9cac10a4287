"""One capture run: one sample, one policy variant, one cache ratio -> the rows of every trace table.

The loop is written here rather than taken from keyformer.generate because it must time each step on
its own (synchronised on GPU), read the kept positions between steps without the bookkeeping entering
the timing, and support teacher forcing (perplexity): the model is called under `policy.apply(model)`
exactly as keyformer.generate does, one token per decode step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from traces import schema
from traces.capture.shadow import PromptShadow, full_cache_attention
from traces.capture.spec import PolicySpec


@dataclass
class RunResult:
    kv: pd.DataFrame
    kept: pd.DataFrame
    steps: pd.DataFrame
    text: dict


def make_policy(spec: PolicySpec, cache_ratio: float, recent_ratio: float | None, max_new_tokens: int, seed: int):
    import keyformer

    cls = keyformer.POLICIES.get(spec.name)
    if cls is None:
        raise ValueError(f"unknown policy {spec.name!r} (choose from {', '.join(keyformer.POLICIES)})")
    fields = set(cls.__dataclass_fields__)
    params = dict(spec.params)
    params["cache_ratio"] = cache_ratio
    # window and streaming define their own recent window: the shared --recent-ratio is not theirs.
    if recent_ratio is not None and spec.name not in ("window", "streaming") and "recent_ratio" not in spec.params:
        params["recent_ratio"] = recent_ratio
    if "max_new_tokens" in fields:
        params.setdefault("max_new_tokens", max_new_tokens)  # keyformer's temperature schedule needs T
    if "seed" in fields:
        params.setdefault("seed", seed)
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ValueError(f"policy {spec.name} has no parameter {', '.join(unknown)}")
    return keyformer.make_policy(spec.name, **params)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _held_positions(policy, n_layers: int) -> list[list[np.ndarray]]:
    """Per layer, per KV head: sorted original positions held (batch row 0)."""
    out = []
    for layer in range(n_layers):
        kept = policy.kept_positions(layer)[0].cpu().numpy()
        out.append([row[row >= 0] for row in kept])
    return out


@torch.no_grad()
def capture_one(lm, spec: PolicySpec, cache_ratio: float, recent_ratio: float | None, prompt: list[int],
                forced: list[int] | None, max_new_tokens: int, seed: int, sample_id: str, reference: str,
                shadow_memo: dict | None = None) -> RunResult:
    """Run prefill + (max_new_tokens - 1) decode steps; greedy unless `forced` gives the tokens."""
    from keyformer import compat

    model = lm.model
    device = next(model.parameters()).device
    n_layers = model.config.num_hidden_layers
    n = len(prompt)
    policy = make_policy(spec, cache_ratio, recent_ratio, max_new_tokens, seed)
    cache_kw = compat.cache_kwarg_name(model)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_bytes_per_token_head = 2 * head_dim * next(model.parameters()).element_size()  # K and V

    held: list[list[list[np.ndarray]]] = []  # step index (0 = prefill) -> layer -> head -> positions
    step_rows = []
    tokens: list[int] = []

    def record(step: int, logits: torch.Tensor, wall: float, peak: int) -> int:
        logp = torch.log_softmax(logits.float(), dim=-1)
        top1 = int(logp.argmax())
        index = len(tokens)
        token = forced[index] if forced is not None else top1
        tokens.append(token)
        held.append(_held_positions(policy, n_layers))
        lengths = [len(h) for layer in held[-1] for h in layer]
        work = policy.score_work.by_step.get(step, {})
        step_rows.append({
            "sample": sample_id, "policy": spec.label, "cache_ratio": cache_ratio, "step": step,
            "phase": "prefill" if step == schema.PREFILL_STEP else "decode", "prompt_len": n,
            "kv_len_mean": float(np.mean(lengths)),
            "kv_cache_bytes": int(sum(lengths) * kv_bytes_per_token_head),
            "wall_s": wall, "peak_mem_bytes": peak,
            "score_flops": float(work.get("flops", 0)), "score_elems": float(work.get("elements", 0)),
            "token": token, "top1": top1, "nll": float(-logp[token]),
        })
        return token

    def timed_forward(**kwargs):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _sync(device)
        started = time.perf_counter()
        out = model(**kwargs)
        _sync(device)
        wall = time.perf_counter() - started
        peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else -1
        return out, wall, peak

    with policy.apply(model):
        ids = torch.tensor([prompt], device=device)
        out, wall, peak = timed_forward(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
        cache = compat.output_cache(out)
        token = record(schema.PREFILL_STEP, out.logits[0, -1], wall, peak)
        for step in range(max_new_tokens - 1):
            out, wall, peak = timed_forward(input_ids=torch.tensor([[token]], device=device),
                                            use_cache=True, **{cache_kw: cache})
            cache = compat.output_cache(out)
            token = record(step, out.logits[0, -1], wall, peak)

    held_mask = _held_mask(held, n + len(tokens))
    mass = _mass_retained(lm, prompt, tokens, held_mask, device, shadow_memo)
    kv, kept = _kv_tables(sample_id, spec.label, cache_ratio, n, held_mask, mass)
    eos = lm.tokenizer.eos_token_id
    cut = tokens.index(eos) if (forced is None and eos in tokens) else len(tokens)
    text = {"sample": sample_id, "policy": spec.label, "cache_ratio": cache_ratio, "prompt_len": n,
            "generated": lm.tokenizer.decode(tokens[:cut], skip_special_tokens=True).strip(),
            "reference": reference, "tokens": tokens, "teacher_forced": forced is not None,
            "stopped_at_eos": cut < len(tokens)}
    return RunResult(kv, kept, pd.DataFrame(step_rows), text)


def _held_mask(held, length: int) -> np.ndarray:
    """(rows, layers, kv_heads, length) bool: which positions each head holds after each step."""
    rows, n_layers, n_heads = len(held), len(held[0]), len(held[0][0])
    mask = np.zeros((rows, n_layers, n_heads, length), dtype=bool)
    for j in range(rows):
        for layer in range(n_layers):
            for head in range(n_heads):
                mask[j, layer, head, held[j][layer][head]] = True
    return mask


def _mass_retained(lm, prompt, tokens, held_mask, device, shadow_memo) -> np.ndarray:
    """(steps, layers, kv_heads): full-cache attention share of the next query on the held tokens + itself.

    Row j (step j - 1) is judged by the query at position n + j, the token the next step feeds; its
    probabilities come from a full-cache pass over the same prompt + generated tokens.
    """
    n, rows = len(prompt), len(tokens)
    sequence = tuple(prompt) + tuple(tokens)
    probs = shadow_memo.get(sequence) if shadow_memo is not None else None
    if probs is None:
        if shadow_memo is not None:
            prompt_pass = shadow_memo.get("prompt")
            if prompt_pass is None or prompt_pass.n != n:
                prompt_pass = shadow_memo["prompt"] = PromptShadow(lm.model, list(prompt), device)
            by_layer = prompt_pass.attention(list(tokens))
        else:
            by_layer = full_cache_attention(lm.model, list(sequence), rows, device)
        probs = torch.stack([by_layer[i] for i in range(len(by_layer))]).cpu().numpy()  # (L, H, rows, S)
        if shadow_memo is not None:
            shadow_memo[sequence] = probs
    attended = held_mask.copy()
    attended[np.arange(rows), :, :, n + np.arange(rows)] = True  # the query itself is always attended
    return np.einsum("lhjs,jlhs->jlh", probs, attended.astype(probs.dtype))


def _kv_tables(sample_id, label, cache_ratio, n, held_mask, mass) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, n_layers, n_heads, _ = held_mask.shape
    step, layer, head = (a.ravel() for a in np.meshgrid(np.arange(rows) - 1, np.arange(n_layers),
                                                        np.arange(n_heads), indexing="ij"))
    keys = {"sample": sample_id, "policy": label, "cache_ratio": cache_ratio, "step": step, "layer": layer,
            "head": head}
    kv = pd.DataFrame({**keys, "prompt_len": n, "kv_len": held_mask.sum(-1).ravel(),
                       "kept_prompt": held_mask[..., :n].sum(-1).ravel(), "mass_retained": mass.ravel()})
    entered = held_mask[1:] & ~held_mask[:-1]
    left = held_mask[:-1] & ~held_mask[1:]
    bitmaps, added, evicted = [], [], []
    for j in range(rows):
        for lyr in range(n_layers):
            for hd in range(n_heads):
                if j == 0:
                    bitmaps.append(np.packbits(held_mask[0, lyr, hd, :n]).tobytes())
                    # Nothing but prompt tokens exists after a prefill; kept explicit rather than assumed.
                    added.append(np.flatnonzero(held_mask[0, lyr, hd, n:]).astype(np.int32) + n)
                    evicted.append([])
                else:
                    bitmaps.append(None)
                    added.append(np.flatnonzero(entered[j - 1, lyr, hd]).astype(np.int32))
                    evicted.append(np.flatnonzero(left[j - 1, lyr, hd]).astype(np.int32))
    kept = pd.DataFrame({**keys, "kept_bitmap": bitmaps, "added": added, "evicted": evicted})
    return kv, kept
