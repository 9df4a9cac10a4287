"""Manual decode loop under a KV policy (gpt-fast style), a synthetic long-context state for timing, and
its command line (keyformer.cli):

    python -m keyformer.generate --model DIR --policy keyformer --cache-ratio 0.5 --prompt "Once upon" --json

    state = prefill(model, policy, input_ids, attention_mask)   # applies the policy if it is not applied
    decode_n_tokens(state, 31)                                  # state.tokens: (batch, 32) greedy tokens
    state.close()                                               # or use `with prefill(...) as state:`
"""
from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field

import torch

from keyformer import compat
from keyformer.attention import attention_modules, install_slot_layers


@dataclass
class DecodeState:
    """Everything a decode step needs; `tokens` are the greedy tokens so far (the first comes from the
    prompt's logits), `logits` the last step's fp32 logits (batch, vocab)."""
    model: torch.nn.Module
    policy: object
    cache: object
    logits: torch.Tensor
    next_token: torch.Tensor  # (batch, 1): the token the next decode step feeds
    generated: list = field(default_factory=list)
    step_s: list = field(default_factory=list)  # wall seconds per decode step
    prefill_s: float = 0.0
    cache_name: str = "cache"
    _context: contextlib.ExitStack | None = None

    @property
    def tokens(self) -> torch.Tensor:
        return torch.cat(self.generated, dim=1)

    def close(self) -> None:
        """Restore the model if `prefill` applied the policy itself."""
        if self._context is not None:
            self._context.close()
            self._context = None

    def __enter__(self) -> "DecodeState":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ensure_applied(model, policy) -> contextlib.ExitStack | None:
    if policy._applied_to is model:
        return None
    stack = contextlib.ExitStack()
    stack.enter_context(policy.apply(model))
    return stack


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _greedy(state: DecodeState, logits: torch.Tensor) -> None:
    state.logits = logits.float()
    state.next_token = state.logits.argmax(dim=-1, keepdim=True)
    state.generated.append(state.next_token)


@torch.no_grad()
def prefill(model, policy, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            record: "PrefillRecord | None" = None) -> DecodeState:
    """Run the prompt with full attention, let the policy keep its budget, pick the first token greedily.

    With `record` (from `record_prefill` on the same input) the model's prompt forward is not run again: the
    policy scores and selects from the recorded logits, exactly as it would have during the forward, and
    `prefill_s` is the recorded forward's time."""
    if record is not None and not torch.equal(record.input_ids, input_ids):
        raise ValueError("the prefill record was made for another input")
    context = _ensure_applied(model, policy)
    cache_name = compat.cache_kwarg_name(model)
    cache = compat.DynamicCache()
    device = input_ids.device
    _synchronize(device)
    start = time.perf_counter()
    try:
        if record is not None:
            cache, last_logits = _replay_prefill(model, policy, record)
        else:
            out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **{cache_name: cache})
            last_logits = out.logits[:, -1]
    except BaseException:
        if context is not None:
            context.close()
        raise
    _synchronize(device)
    wall = record.wall_s if record is not None else time.perf_counter() - start
    state = DecodeState(model, policy, cache, logits=last_logits, next_token=input_ids[:, -1:],
                        prefill_s=wall, cache_name=cache_name, _context=context)
    _greedy(state, last_logits)
    return state


@dataclass
class PrefillRecord:
    """A prompt's full-attention forward, kept so that many policies can start from it without running the
    model again: per layer the cached K/V and the fp32 attention logits (probabilities are recomputed from
    them by the same softmax), plus the logits of the last prompt position. The prompt phase is the same
    computation for every policy (full attention over the n prompt tokens); only the selection differs."""
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    keys: list
    values: list
    logits: list  # layer -> (B, H_kv, G, n, n) fp32
    last_logits: torch.Tensor  # (B, vocab)
    wall_s: float
    # prompt_score_key -> (per-layer reduced scores, elements, generator state after the prompt): a policy that
    # scores the prompt like an earlier one (Keyformer at another cache ratio) reuses its scores
    scores: dict = field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for group in (self.keys, self.values, self.logits) for t in group)


@torch.no_grad()
def record_prefill(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> PrefillRecord:
    """Run the prompt once under the full policy and keep what `prefill(..., record=)` replays."""
    from keyformer.full import FullPolicy

    recorded: dict[int, tuple] = {}

    class Recording(FullPolicy):
        def observe_attention(self, layer, logits, probs):
            recorded[layer.layer_idx] = (layer.keys, layer.values, logits)
            super().observe_attention(layer, logits, probs)

    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    with prefill(model, Recording(), input_ids, attention_mask) as state:
        layers = [recorded[i] for i in range(len(recorded))]
        return PrefillRecord(input_ids, attention_mask, [k for k, _, _ in layers], [v for _, v, _ in layers],
                             [g for _, _, g in layers], state.logits.clone(), state.prefill_s)


def _replay_prefill(model, policy, record: PrefillRecord) -> tuple:
    """The policy's prompt phase from a record: the same calls, in the same layer order, as a forward."""
    cache = compat.DynamicCache()
    install_slot_layers(policy, cache, len(record.keys))
    policy.start_prompt(record.attention_mask, record.input_ids)
    key = policy.prompt_score_key() if policy.needs_scores else None
    cached = record.scores.get(key)
    if cached is not None:
        per_layer, elements, rng = cached
        for layer, keys, values, scores in zip(cache.layers, record.keys, record.values, per_layer):
            layer.update(keys, values)
            policy.observe_scores(layer, None if scores is None else scores.clone(),
                                  elements if layer.window is None else 0)  # sliding layers score nothing
        policy.set_rng_state(rng)
        return cache, record.last_logits
    seen = []
    original = policy.finalize_prompt_scores

    def keep(scores):  # the reduced prompt scores, before the policy's own finalisation
        seen.append(scores.clone())
        return original(scores)
    policy.finalize_prompt_scores = keep
    try:
        for layer, keys, values, logits in zip(cache.layers, record.keys, record.values, record.logits):
            layer.update(keys, values)
            policy.observe_attention(layer, logits, torch.softmax(logits, dim=-1))
    finally:
        del policy.finalize_prompt_scores
    scored = [layer for layer in cache.layers if layer.window is None]  # sliding-window layers score nothing
    if key is not None and len(seen) == len(scored):
        by_layer = iter(seen)
        per_layer = [None if layer.window is not None else next(by_layer) for layer in cache.layers]
        record.scores[key] = (per_layer, record.logits[0].numel(), policy.rng_state())
    return cache, record.last_logits


@torch.no_grad()
def decode_one_token(state: DecodeState) -> torch.Tensor:
    """One decode step: feed the last token, attend over the k (+1) slots, evict one; returns the logits."""
    device = state.next_token.device
    _synchronize(device)
    start = time.perf_counter()
    out = state.model(input_ids=state.next_token, use_cache=True, **{state.cache_name: state.cache})
    _synchronize(device)
    state.step_s.append(time.perf_counter() - start)
    _greedy(state, out.logits[:, -1])
    return state.logits


@torch.no_grad()
def decode_n_tokens(state: DecodeState, n: int, eos_token_id: int | None = None) -> torch.Tensor:
    """`n` greedy decode steps (fewer if every sequence emitted `eos_token_id`); returns the new tokens.

    Keyformer's temperature schedule needs T, the number of generated tokens: when the policy leaves
    `max_new_tokens` unset, T = tokens generated so far + n.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if getattr(state.policy, "max_new_tokens", 0) is None:
        state.policy.max_new_tokens = len(state.generated) + n
    done = torch.zeros(state.next_token.shape[0], dtype=torch.bool, device=state.next_token.device)
    first = len(state.generated)
    for _ in range(n):
        if eos_token_id is not None:
            done |= state.next_token.squeeze(-1) == eos_token_id
            if bool(done.all()):
                break
        decode_one_token(state)
    return torch.cat(state.generated[first:], dim=1) if len(state.generated) > first else state.next_token[:, :0]


def kv_shape(model) -> tuple[int, int]:
    """(KV heads, head dim) of the model's attention from its config."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads, head_dim


@torch.no_grad()
def synthetic_state(model, policy, batch: int, context_len: int, seed: int = 0,
                    max_new_tokens: int = 128) -> DecodeState:
    """The state a prefill of `context_len` tokens would leave, without running it: random K/V in the
    model's dtype and device, the policy's budget k, kept positions (the recent window plus a random choice
    of key tokens per head, as a selection would give) and random positive scores. `max_new_tokens` is
    Keyformer's T when the policy leaves it unset. The policy stays applied until `state.close()`."""
    if batch < 1 or context_len < 1:
        raise ValueError(f"batch and context_len must be >= 1, got {batch} and {context_len}")
    context = _ensure_applied(model, policy)
    if any(window is not None for window in policy.layer_windows):
        if context is not None:
            context.close()
        raise ValueError(f"{model.config.model_type}: synthetic states of models with sliding-window layers are "
                         "not supported (run a prefill)")
    if getattr(policy, "max_new_tokens", 0) is None:
        policy.max_new_tokens = max_new_tokens
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    generator = torch.Generator(device="cpu").manual_seed(seed)
    # K/V are the bulk (GB at 4k x batch 8 on 6B models): draw them on the model's device, in its dtype,
    # instead of as fp32 on one CPU thread followed by a copy.
    kv_generator = torch.Generator(device=device).manual_seed(seed)
    kv_heads, head_dim = kv_shape(model)
    n_layers = len(attention_modules(model))
    policy.start_prompt(torch.ones(batch, context_len, dtype=torch.long))
    cache = compat.DynamicCache()
    install_slot_layers(policy, cache, n_layers)
    held = int(policy.budget.max())
    recent = int(policy.recent.max())
    for layer in cache.layers:
        if policy.evicts:
            keys_part = torch.rand(batch, kv_heads, context_len - recent, generator=generator)
            key_tokens = keys_part.topk(held - recent, dim=-1).indices.sort(dim=-1).values
            window = torch.arange(context_len - recent, context_len).expand(batch, kv_heads, recent)
            positions = torch.cat([key_tokens, window], dim=-1)
        else:
            positions = torch.arange(context_len).expand(batch, kv_heads, context_len)
        slots = held + 1
        layer.lazy_initialization(torch.empty(0, dtype=dtype, device=device), None)
        shape = (batch, kv_heads, slots, head_dim)
        layer.keys = torch.randn(shape, generator=kv_generator, device=device, dtype=dtype)
        layer.values = torch.randn(shape, generator=kv_generator, device=device, dtype=dtype)
        layer.positions = torch.cat([positions, torch.full((batch, kv_heads, 1), -1)], dim=-1).to(device)
        layer.scores = torch.rand(batch, kv_heads, slots, generator=generator).to(device)
        layer.scores[..., -1] = 0.0
        layer.free_slot = torch.full((batch, kv_heads), held, dtype=torch.long, device=device)
        layer.in_prefill = False
    vocab = model.config.vocab_size
    next_token = torch.randint(vocab, (batch, 1), generator=generator).to(device)
    logits = torch.zeros(batch, vocab, device=device)
    return DecodeState(model, policy, cache, logits=logits, next_token=next_token, generated=[next_token],
                       cache_name=compat.cache_kwarg_name(model), _context=context)


# ---- command line -----------------------------------------------------------------------------------------


if __name__ == "__main__":   # `python -m keyformer.generate`: the CLI lives in keyformer.cli
    from keyformer.cli import main

    sys.exit(main())
