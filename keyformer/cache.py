"""The slot cache: a preallocated K/V buffer per layer whose slots are reused in place.

Layout per layer: keys/values `[batch, kv_heads, slots, head_dim]`, plus per slot its original token
position (`positions`, -1 = empty) and its accumulated score (`scores`, fp32). Attention over the slots
is order-independent once positions and masks are right, so a decode step writes the incoming token into
the slot freed by the previous eviction (one `scatter_` of `batch*kv_heads*head_dim` values) instead of
concatenating or compacting: no step copies the cache. Each (sequence, head) may hold a different set of
tokens, which is exactly what per-head eviction needs.

Lifecycle of one layer:
1. prefill: `update` receives the whole prompt and returns it unchanged (full attention for the first
   token); the attention function scores it and calls `compact`, which gathers the kept tokens into a
   fresh buffer of `budget + 1` slots. The prompt-sized tensors are then released.
2. decode: `update` writes the newcomer into `free_slot` and returns the whole buffer; after attention the
   policy marks one slot empty again (`evict`).
"""
from __future__ import annotations

import torch

from keyformer.compat import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, policy, layer_idx: int, window: int | None = None):
        super().__init__()
        self.policy = policy
        self.layer_idx = layer_idx
        # sliding-window layer: its query attends to the `window` newest tokens (itself included), so the layer
        # holds the window - 1 newest between steps, whatever the policy (positional eviction, no scores)
        self.window = window
        self.positions: torch.Tensor | None = None  # (B, H, slots) long, -1 = empty
        self.scores: torch.Tensor | None = None  # (B, H, slots) fp32
        self.free_slot: torch.Tensor | None = None  # (B, H) long: where the next token goes
        self.in_prefill = False  # True between the prompt's update and its compaction
        self.prompt_positions: torch.Tensor | None = None  # (B, n) during prefill

    # --- transformers' layer interface -------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.policy._active_layer = self.layer_idx
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states, value_states
            self.in_prefill = True
            return key_states, value_states
        if key_states.shape[-2] != 1:
            raise ValueError(
                f"a cache under an eviction policy takes one new token per step, got {key_states.shape[-2]} "
                "(multi-token continuation and assisted decoding are not supported)")
        if self.window is None:
            self._ensure_free_slot()
        batch, heads, _, dim = key_states.shape
        slot = self.free_slot.view(batch, heads, 1, 1).expand(batch, heads, 1, dim)
        self.keys.scatter_(2, slot, key_states)
        self.values.scatter_(2, slot, value_states)
        self.positions.scatter_(2, self.free_slot.unsqueeze(-1), self.policy._newcomer_positions(batch, heads))
        self.scores.scatter_(2, self.free_slot.unsqueeze(-1), 0.0)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # Prefill: a plain causal mask over the prompt. Decode: the registered mask function returns no mask
        # (the attention function masks empty slots itself), so only the size has to be consistent.
        return self.get_seq_length() + (query_length if not self.is_initialized else 0), 0

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.shape[-2]

    def get_max_length(self) -> int:
        return -1 if self.keys is None else self.keys.shape[-2]

    def reset(self) -> None:
        self.keys = self.values = self.positions = self.scores = self.free_slot = None
        self.is_initialized = False
        self.in_prefill = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: every per-slot tensor follows its beam, scores included."""
        if not self.is_initialized:
            return
        for name in ("keys", "values", "positions", "scores", "free_slot"):
            tensor = getattr(self, name)
            setattr(self, name, tensor.index_select(0, beam_idx.to(tensor.device)))
        if self.layer_idx == 0:
            self.policy._reorder_sequences(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            raise ValueError("cannot expand a compressed cache across beams after the prompt")

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError("a cache under an eviction policy cannot be cropped")

    # --- slot bookkeeping ---------------------------------------------------------------------------
    def compact(self, keep_idx: torch.Tensor, keep_valid: torch.Tensor, prompt_positions: torch.Tensor,
                prompt_scores: torch.Tensor | None, extra_slots: int = 1) -> None:
        """Keep the prompt tokens `keep_idx` (B, H, K) in a fresh buffer of K + extra_slots slots.

        `keep_valid` (B, K) or (B, H, K) marks which picks are real (sequences with a smaller budget than the
        batch maximum leave their tail slots empty). The prompt-sized K/V are released here.
        """
        batch, heads, kept = keep_idx.shape
        dim = self.keys.shape[-1]
        slots = kept + extra_slots
        gather = keep_idx.unsqueeze(-1).expand(batch, heads, kept, dim)
        keys = self.keys.new_empty(batch, heads, slots, dim)
        values = self.values.new_empty(batch, heads, slots, self.values.shape[-1])
        keys[:, :, :kept] = self.keys.gather(2, gather)
        values[:, :, :kept] = self.values.gather(
            2, keep_idx.unsqueeze(-1).expand(batch, heads, kept, values.shape[-1]))
        keys[:, :, kept:] = 0
        values[:, :, kept:] = 0
        positions = torch.full((batch, heads, slots), -1, dtype=torch.long, device=keys.device)
        pos = prompt_positions.unsqueeze(1).expand(batch, heads, -1).gather(2, keep_idx)
        valid = keep_valid if keep_valid.dim() == 3 else keep_valid.unsqueeze(1).expand(batch, heads, kept)
        positions[:, :, :kept] = torch.where(valid, pos, -1)
        scores = torch.zeros((batch, heads, slots), dtype=torch.float32, device=keys.device)
        if prompt_scores is not None:
            scores[:, :, :kept] = torch.where(valid, prompt_scores.gather(2, keep_idx), 0.0)
        self.keys, self.values, self.positions, self.scores = keys, values, positions, scores
        self.free_slot = valid.sum(-1)  # the first empty slot of each (sequence, head)
        self.in_prefill = False

    def evict(self, slot: torch.Tensor) -> None:
        """Empty one slot per (sequence, head); the next token will be written there."""
        self.positions.scatter_(2, slot.unsqueeze(-1), -1)
        self.scores.scatter_(2, slot.unsqueeze(-1), 0.0)
        self.free_slot = slot

    def _ensure_free_slot(self) -> None:
        """Policies without eviction (full) grow: amortised doubling, so growth copies are rare. So does a
        variable-length policy's buffer when one of its heads keeps every slot (adakv: a head may win more
        than k)."""
        if self.policy.evicts and self.policy.evicts_while_decoding and not self.policy.variable_lengths:
            return
        slots = self.keys.shape[-2]
        if int(self.free_slot.max()) < slots:
            return
        extra = max(64, slots // 2)
        batch, heads, _, dim = self.keys.shape
        self.keys = torch.cat([self.keys, self.keys.new_zeros(batch, heads, extra, dim)], dim=2)
        self.values = torch.cat([self.values, self.values.new_zeros(batch, heads, extra, self.values.shape[-1])],
                                dim=2)
        self.positions = torch.cat([self.positions, self.positions.new_full((batch, heads, extra), -1)], dim=2)
        self.scores = torch.cat([self.scores, self.scores.new_zeros(batch, heads, extra)], dim=2)

    def keep_window(self) -> None:
        """Sliding-window layer: after the prompt keep its window - 1 newest real tokens per sequence in a
        buffer of `window` slots; after a decode step evict the oldest token of each (sequence, head) that holds
        more than window - 1 (the newcomer included), else leave the next empty slot for the next token."""
        held = self.window - 1
        if self.in_prefill:
            prompt = self.policy.prompt_positions.to(self.keys.device)  # (B, n), -1 = padding
            batch, heads, n = self.keys.shape[:3]
            kept = min(n, held)
            keep_idx = prompt.float().topk(kept, dim=-1).indices.unsqueeze(1).expand(batch, heads, kept)
            lengths = self.policy.prompt_lengths.to(self.keys.device).view(batch, 1)
            keep_valid = torch.arange(kept, device=self.keys.device).view(1, kept) < torch.clamp(lengths, max=held)
            self.compact(keep_idx, keep_valid, prompt, None, extra_slots=self.window - kept)
            return
        pos = self.positions
        valid = pos >= 0
        over = valid.sum(-1) > held  # (B, H)
        oldest = torch.where(valid, pos, torch.iinfo(torch.long).max).min(dim=-1).indices
        empty = (~valid).to(torch.int8).argmax(dim=-1)
        slot = torch.where(over, oldest, empty).unsqueeze(-1)
        self.positions.scatter_(2, slot, torch.where(over.unsqueeze(-1), -1, pos.gather(2, slot)))  # empty it
        self.free_slot = slot.squeeze(-1)

    def valid(self) -> torch.Tensor:
        return self.positions >= 0

    def kept_positions(self) -> torch.Tensor:
        """Original positions held, (B, H, n_held) ascending; -1 pads sequences that hold fewer tokens."""
        big = torch.iinfo(torch.long).max
        ordered = torch.where(self.positions >= 0, self.positions, big).sort(dim=-1).values
        held = int((self.positions >= 0).sum(-1).max())
        ordered = ordered[..., :held]
        return torch.where(ordered == big, -1, ordered)

    def tokens_held(self) -> int:
        """Tokens held per (sequence, KV head), maximum over the batch."""
        if self.in_prefill:
            return self.keys.shape[-2]
        return int((self.positions >= 0).sum(-1).max())

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values) if t is not None)


class SlotCache(Cache):
    """A `Cache` whose layers are `SlotLayer`s of one policy (used by the manual loop and synthetic states)."""

    def __init__(self, policy, n_layers: int):
        super().__init__(layers=[SlotLayer(policy, i) for i in range(n_layers)])
