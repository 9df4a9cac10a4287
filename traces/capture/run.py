"""One capture run: one sample, one policy variant, one cache ratio -> the rows of every trace table.

The loop is written here rather than taken from keyformer.generate because it must time each step on
its own (synchronised on GPU), read the kept positions between steps without the bookkeeping entering
the timing, and support teacher forcing (perplexity): the model is called under `policy.apply(model)`
exactly as keyformer.generate does, one token per decode step.
"""
from __future__ import annotations

import time
import zlib
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


def sample_stream(sample_id: str) -> int:
    """The sample index a noise policy's stream is seeded with (keyformer: seed, sample, replica): a hash of the
    sample's id, so a sample draws the same noise in any batch, order, subset or resumed shard of a capture."""
    return zlib.crc32(str(sample_id).encode())


def rules_metadata(policy) -> dict:
    """What a variant's label cannot say, as flat fields of each text row: the rule version of keyformer/ it
    ran under and, for noise policies, how its noise streams were seeded (docs/traces.md, "Rule versions")."""
    import keyformer

    rules = {"rules_version": keyformer.RULES_VERSION}
    if hasattr(policy, "sample_indices"):
        rules["noise_stream"] = "seed/crc32(sample id)/replica"
    return rules


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _held_positions(policy, n_layers: int, batch: int) -> list[list[list[np.ndarray]]]:
    """Per batch row, per layer, per KV head: sorted original positions held."""
    per_layer = [policy.kept_positions(layer).cpu().numpy() for layer in range(n_layers)]
    return [[[row[row >= 0] for row in per_layer[layer][b]] for layer in range(n_layers)] for b in range(batch)]


@torch.no_grad()
def capture_one(lm, spec: PolicySpec, cache_ratio: float, recent_ratio: float | None, prompt: list[int],
                forced: list[int] | None, max_new_tokens: int, seed: int, sample_id: str, reference: str,
                shadow_memo: dict | None = None, record=None, detail: str = "full") -> RunResult:
    """One sample: `capture_batch` with a batch of one."""
    return capture_batch(lm, spec, cache_ratio, recent_ratio, [prompt], None if forced is None else [forced],
                         max_new_tokens, seed, [sample_id], [reference], [shadow_memo], record, detail)[0]


@torch.no_grad()
def capture_batch(lm, spec: PolicySpec, cache_ratio: float, recent_ratio: float | None, prompts: list,
                  forced: list | None, max_new_tokens: int, seed: int, sample_ids: list, references: list,
                  shadow_memos: list | None = None, record=None, detail: str = "full") -> list[RunResult]:
    """Run prefill + (max_new_tokens - 1) decode steps over a left-padded batch of prompts under one policy;
    greedy unless `forced` gives each sample's tokens. Returns one result per sample.

    Budgets, positions and kept tokens are per sequence (k from each sample's own, unpadded length); a step's
    wall time is the batch's. Noise policies draw each sample's noise from its own stream (seed, sample id:
    `sample_stream`), so a Keyformer run's kept tokens do not depend on the batch it ran in. Each text row
    records the rules the run used (`rules_metadata`).

    `record` (keyformer.generate.record_prefill of this padded batch) replaces the prompts' forward: the
    policy selects from the recorded full-attention logits, the same computation (tests/keyformer checks
    it), and the prefill rows' wall time is the recorded forward's. `detail="summary"` keeps one kv row per
    step (means over layers and heads, layer = head = -1) and no kept positions: what quality needs, in a
    fraction of the space."""
    from keyformer import compat

    model = lm.model
    device = next(model.parameters()).device
    n_layers = model.config.num_hidden_layers
    batch = len(prompts)
    shadow_memos = shadow_memos or [None] * batch
    ids, mask = padded_batch(prompts, lm.tokenizer, device)
    policy = make_policy(spec, cache_ratio, recent_ratio, max_new_tokens, seed)
    if hasattr(policy, "sample_indices"):  # noise streams: (seed, sample, replica), whatever the batch
        policy.sample_indices = [sample_stream(s) for s in sample_ids]
    cache_kw = compat.cache_kwarg_name(model)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_bytes_per_token_head = 2 * head_dim * next(model.parameters()).element_size()  # K and V

    held: list = []  # step index (0 = prefill) -> batch row -> layer -> head -> positions
    step_rows: list[list[dict]] = [[] for _ in range(batch)]
    tokens: list[list[int]] = [[] for _ in range(batch)]

    def record_step(step: int, logits: torch.Tensor, wall: float, peak: int) -> torch.Tensor:
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B, vocab)
        top1 = logp.argmax(dim=-1)
        index = len(tokens[0])
        chosen = (torch.tensor([f[index] for f in forced], device=logp.device) if forced is not None else top1)
        nll = -logp.gather(1, chosen.view(-1, 1)).squeeze(1)
        held.append(_held_positions(policy, n_layers, batch))
        work = policy.score_work.by_step.get(step, {})
        for b in range(batch):
            token = int(chosen[b])
            tokens[b].append(token)
            lengths = [len(h) for layer in held[-1][b] for h in layer]
            step_rows[b].append({
                "sample": sample_ids[b], "policy": spec.label, "cache_ratio": cache_ratio, "step": step,
                "phase": "prefill" if step == schema.PREFILL_STEP else "decode", "prompt_len": len(prompts[b]),
                "kv_len_mean": float(np.mean(lengths)),
                "kv_cache_bytes": int(sum(lengths) * kv_bytes_per_token_head),
                "wall_s": wall, "peak_mem_bytes": peak,
                "score_flops": float(work.get("flops", 0)) / batch, "score_elems": float(work.get("elements", 0)) / batch,
                "token": token, "top1": int(top1[b]), "nll": float(nll[b]),
            })
        return chosen.view(batch, 1)

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
        if record is not None:
            from keyformer.generate import prefill as replay

            state = replay(model, policy, ids, mask, record=record)
            cache = state.cache
            token = record_step(schema.PREFILL_STEP, state.logits, state.prefill_s, -1)
        else:
            out, wall, peak = timed_forward(input_ids=ids, attention_mask=mask, use_cache=True)
            cache = compat.output_cache(out)
            token = record_step(schema.PREFILL_STEP, out.logits[:, -1], wall, peak)
        for step in range(max_new_tokens - 1):
            out, wall, peak = timed_forward(input_ids=token, use_cache=True, **{cache_kw: cache})
            cache = compat.output_cache(out)
            token = record_step(step, out.logits[:, -1], wall, peak)

    results = []
    rules = rules_metadata(policy)
    eos = lm.tokenizer.eos_token_id
    for b in range(batch):
        n, generated = len(prompts[b]), tokens[b]
        held_mask = _held_mask([row[b] for row in held], n + len(generated))
        mass = _mass_retained(lm, prompts[b], generated, held_mask, device, shadow_memos[b])
        kv, kept = _kv_tables(sample_ids[b], spec.label, cache_ratio, n, held_mask, mass)
        if detail == "summary":
            kv, kept = summarize_kv(kv), kept.iloc[:0]
        cut = generated.index(eos) if (forced is None and eos in generated) else len(generated)
        text = {"sample": sample_ids[b], "policy": spec.label, "cache_ratio": cache_ratio, "prompt_len": n,
                "generated": lm.tokenizer.decode(generated[:cut], skip_special_tokens=True).strip(),
                "reference": references[b], "tokens": generated, "teacher_forced": forced is not None,
                "stopped_at_eos": cut < len(generated), "batch": batch, **rules}
        results.append(RunResult(kv, kept, pd.DataFrame(step_rows[b]), text))
    return results


def padded_batch(prompts: list, tokenizer, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and their attention mask (the pad id never reaches attention: it is masked)."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt):] = torch.tensor(prompt)
        mask[b, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


def summarize_kv(kv: pd.DataFrame) -> pd.DataFrame:
    """One row per step: kv_len, kept_prompt and mass_retained averaged over layers and KV heads (layer =
    head = -1). Means of equal-sized groups, so every mean over steps equals the detailed table's."""
    keys = ["sample", "policy", "cache_ratio", "step", "prompt_len"]
    out = kv.groupby(keys, sort=False).agg(kv_len=("kv_len", "mean"), kept_prompt=("kept_prompt", "mean"),
                                            mass_retained=("mass_retained", "mean")).reset_index()
    out["kv_len"] = out["kv_len"].round().astype(np.int32)
    out["kept_prompt"] = out["kept_prompt"].round().astype(np.int32)
    return out.assign(layer=-1, head=-1)


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
