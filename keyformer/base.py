"""What every policy shares: budget, selection, gather, bookkeeping, observers. Policies only say how
tokens are scored (`score_increment`) and ranked (`priority`); see full.py ... keyformer.py.

Conventions (the paper's §3, shared/docs/keyformer-paper.md §1, and sim/kvlen.py):
- budget k = max(1, floor(p * n_real)) per sequence, n_real = the unpadded prompt length; the recent window
  is w = floor(r * k) (r = 0 means pure key tokens, never "no eviction"). Frozen-key selection
  (`selection="official"`, the released code) rounds as that code does: k = int(n * P / 100) and
  w = int(k * R / 100) with P = 100 p and R = 100 r, the percentages its scripts take (floor(p * n) in float64
  differs by one token for some n: 143 of the prompt lengths 1..8192 at p = 0.7).
- prefill: full attention over all n prompt tokens (the first token needs it); then keep the last w real
  tokens plus the top (k - w) of the other n - w by priority, per layer, per KV head, per sequence.
- decode step s (s = 0 first): the newcomer enters the cache (k + 1 tokens are attended), scores are
  accumulated, and the lowest-priority token outside the recent window (the w newest, newcomer included)
  leaves, so every layer and head holds exactly k tokens again. Variable-length policies (mass, pyramidkv,
  adakv: `variable_lengths`) keep what their `keep_mask` keeps instead, any number per head and step.
- `budget_base="padded"`: the released scripts left-pad every prompt to `pad_length` (1920) and k counts
  the pads: k = p * S with S = max(pad_length, n_real), w from that k. Pads never receive attention from a
  real query, so they rank below every real token, and they are not held here (a real token is never
  displaced by one). With the paper's re-ranking this means: the cache grows by one real token a step until
  it holds k, then evicts by score. With frozen keys (the released masking) it means, in real-token
  positions: the keys are the top min(k - w, n - w) of [0, n - w) (all of them when n <= k), frozen; the
  window holds the w - 1 newest plus the incoming token; position n - w leaves at the prompt and one more real
  token (the one leaving the window) at every decode step, so a short prompt attends exactly n real tokens
  from step 0 with a growing hole after its keys (n = 40 padded to 96, k = 48, w = 14: step 10 attends
  [0, 26) and [37, 50]). For n < w the window first slides over pads: nothing leaves until n + s + 1 > w - 1.
- step numbering seen by observers: -1 = prefill, s >= 0 = decode step s.
- positions: "original" (default; the paper's Table 3 winner) feeds every token its original position id
  and, for MPT, gathers ALiBi at the kept tokens' original positions. "renumber" gives the incoming token
  position k (the number of tokens held), StreamingLLM's query-side shift, and MPT's ALiBi uses ranks among
  the held tokens. It is refused on RoPE models (attention.check_positions): their cached keys keep the
  rotation of their original position, and re-rotating them (StreamingLLM's scheme) is not implemented.
- GQA: scores of the query heads of one KV group are summed (`gqa_reduce="sum"`, the paper's own rule of
  summing over query rows extended to the group; "mean" ranks identically and is offered for clarity).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from keyformer.scoring import ScoreWork, StepEvent, check_finite, identical_rows, reduce_queries

POSITION_MODES = ("original", "renumber")
BUDGET_BASES = ("real", "padded")
SELECTIONS = ("paper", "official")
FROZEN = 1e30  # priority of a frozen key token: above any score or position, below the window's +inf


def percent_of(lengths: torch.Tensor, ratio: float) -> torch.Tensor:
    """int(n * P / 100) per entry, P = 100 * ratio as the percentage the released scripts take (`--kv_cache 50`,
    `--recent 30`): the product is exact in float64 and the division rounds once, as Python's does."""
    percent = round(ratio * 100.0, 9)  # 0.29 * 100 = 28.999999999999996 is the user's 29
    return torch.floor(lengths.double() * percent / 100.0).long()


@dataclass
class Policy:
    """Base of all policies. Subclasses are small dataclasses in their own files."""
    cache_ratio: float = 0.5
    recent_ratio: float = 0.3
    position_mode: str = "original"
    gqa_reduce: str = "sum"
    # What k is a fraction of: "real" = each sequence's unpadded prompt length (the paper's text); "padded" =
    # max(pad_length, n_real), as the released scripts do (prompts left-padded to 1920 tokens, the pads
    # counted in k; see the module docstring for what that does to the cache).
    budget_base: str = "real"
    pad_length: int = 1920

    name: ClassVar[str] = "base"
    evicts: ClassVar[bool] = True
    needs_scores: ClassVar[bool] = False
    score_flops_per_element: ClassVar[int] = 0
    evicts_while_decoding: ClassVar[bool] = True  # False: selection at the prompt only, then the cache grows
    accumulates: ClassVar[bool] = True  # False: each decode step's score replaces the previous one (TOVA)
    # True: `keep_mask` decides how many tokens each (sequence, KV head) keeps at every step, so lengths vary
    # per layer, head and step (mass, pyramidkv, adakv); the others hold exactly k (one eviction a step).
    variable_lengths: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not 0.0 < self.cache_ratio <= 1.0:
            raise ValueError(f"cache_ratio must be in (0, 1], got {self.cache_ratio}")
        if not 0.0 <= self.recent_ratio <= 1.0:
            raise ValueError(f"recent_ratio must be in [0, 1], got {self.recent_ratio}")
        if self.position_mode not in POSITION_MODES:
            raise ValueError(f"position_mode must be one of {', '.join(POSITION_MODES)}, got {self.position_mode!r}")
        if self.gqa_reduce not in ("sum", "mean"):
            raise ValueError(f"gqa_reduce must be 'sum' or 'mean', got {self.gqa_reduce!r}")
        if self.budget_base not in BUDGET_BASES:
            raise ValueError(f"budget_base must be one of {', '.join(BUDGET_BASES)}, got {self.budget_base!r}")
        if self.pad_length < 1:
            raise ValueError(f"pad_length must be >= 1, got {self.pad_length}")
        if self.variable_lengths and self.position_mode == "renumber":
            raise ValueError(f"position_mode='renumber' is not supported by {self.name}: its heads hold different "
                             "numbers of tokens, so there is no one renumbered query position")
        self._observers: list[Callable[[StepEvent], None]] = []
        self.score_work = ScoreWork()
        self.profile = False  # when True, time score update + selection (benchmarks)
        self.score_select_s = 0.0
        self.layers: list = []
        self.layer_windows: list = []  # per layer: its sliding window, None = global (set by apply)
        self.step = -1
        self._active_layer = 0
        self._cache = None
        self._applied_to = None

    # ---- what subclasses define ----------------------------------------------------------------------
    def recent_tokens(self, budget: torch.Tensor) -> torch.Tensor:
        """Recent-window size per sequence for budgets k (LongTensor)."""
        if self.frozen_keys:  # the released code: int(k * R / 100)
            return percent_of(budget, self.recent_ratio)
        return torch.floor(self.recent_ratio * budget.double()).long()

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        """(B, H, S) ranking, lower is evicted first. Empty slots and the recent window are handled here."""
        raise NotImplementedError

    @property
    def frozen_keys(self) -> bool:
        """The released code's selection (policies with a `selection` field): keys chosen once, then kept."""
        return getattr(self, "selection", "paper") == "official"

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor | None:
        """This step's score per (B, H_kv, G, q, S) entry from the fp32 logits and the model's softmax (a policy
        that scores one query row returns q = 1)."""
        return None

    def keep_mask(self, layer, positions: torch.Tensor, scores: torch.Tensor | None,
                  protected: torch.Tensor) -> torch.Tensor:
        """Variable-length policies: (B, H, S) bool, the tokens each (sequence, KV head) of `layer` keeps among
        the valid slots (`positions` >= 0) after the prompt (S = n) or a decode step (S = slots, newcomer
        included); `protected` marks the recent window, kept whatever this returns."""
        raise NotImplementedError

    def slot_capacity(self, layer_idx: int) -> int:
        """Variable-length policies: the most tokens one head of the layer may keep after an eviction (its
        buffer gets one slot more; a head that fills it anyway grows the buffer, see cache.SlotLayer)."""
        return int(self.hold.max())

    def finalize_prompt_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """The prompt's (B, H_kv, n) scores just before selection (SnapKV pools them)."""
        return scores

    def begin_sequence(self) -> None:
        """Called at each prefill (e.g. to reseed noise)."""

    def params(self) -> dict:
        """Parameters that define the variant (for traces and the CLI's JSON)."""
        from dataclasses import asdict
        return asdict(self)

    # ---- public API ------------------------------------------------------------------------------------
    def apply(self, model):
        """`with policy.apply(model): model.generate(...)` (see keyformer.attention.apply_policy)."""
        from keyformer.attention import apply_policy
        return apply_policy(self, model)

    def add_observer(self, fn: Callable[[StepEvent], None]) -> None:
        self._observers.append(fn)

    def remove_observer(self, fn: Callable[[StepEvent], None]) -> None:
        self._observers.remove(fn)

    def kept_positions(self, layer: int) -> torch.Tensor:
        """(batch, n_kv_heads, k) original positions held by `layer`, ascending; -1 where a sequence with a
        smaller budget holds fewer tokens than the batch maximum."""
        return self._layer(layer).kept_positions()

    def kv_lengths(self) -> list[int]:
        """Tokens held per KV head by each layer (maximum over the batch)."""
        return [layer.tokens_held() for layer in self.layers]

    def kv_bytes(self) -> int:
        """Bytes of K and V physically allocated by all layers."""
        return sum(layer.nbytes() for layer in self.layers)

    def _layer(self, layer: int):
        if not self.layers or not self.layers[layer].is_initialized:
            raise ValueError(f"layer {layer} holds no cache yet: run a prefill under this policy first")
        return self.layers[layer]

    # ---- per-sequence state (set by the forward pre-hook in attention.py) ---------------------------
    def start_prompt(self, attention_mask: torch.Tensor, inputs: torch.Tensor | None = None) -> torch.Tensor:
        """Budgets and original positions for a new batch of prompts; returns the position ids to feed.

        `inputs` (token ids or embeddings) lets rows that are the same prompt (the beams of one input, which
        transformers expands before the prompt's forward) share prompt-time randomness: `prompt_groups[b]` is
        the first row identical to row b."""
        valid = attention_mask.bool()
        self.prompt_groups = identical_rows(inputs, attention_mask) if inputs is not None else None
        self.prompt_lengths = valid.sum(-1)  # real, unpadded lengths
        if int(self.prompt_lengths.min()) < 1:
            raise ValueError("every sequence needs at least one real (unpadded) prompt token")
        self.decode_evicts = self.evicts and self.evicts_while_decoding
        official = self.frozen_keys
        padded = self.budget_base == "padded"
        if self.evicts:
            base = self.prompt_lengths
            if padded:
                base = torch.clamp(base, min=self.pad_length)
            kept = percent_of(base, self.cache_ratio) if official else torch.floor(self.cache_ratio * base.double()).long()
            self.budget = torch.clamp(kept, min=1)
        else:
            self.budget = self.prompt_lengths.clone()
        self.recent = torch.minimum(self.recent_tokens(self.budget), self.budget)
        # Paper: k tokens held after each eviction, the w newest (newcomer included) protected, k + 1 attended.
        # Official: key tokens frozen at the first selection, w - 1 held besides them, so exactly k are
        # attended with the newcomer (the released mask code's boundary).
        if official and int(self.recent.min()) < 1:
            raise ValueError("selection='official' needs a recent window of at least one token (the incoming "
                             "one): raise recent_ratio or cache_ratio")
        self.hold = self.budget - 1 if official else self.budget
        self.protect = self.recent - 1 if official else self.recent
        if official and padded and self.evicts:
            # The released masking on a left-padded prompt: the real keys are at most the n - w real tokens
            # before the window; the k - w key slots they leave free hold pads (never attended, not held here).
            self.key_limit = torch.clamp(self.prompt_lengths - self.recent, min=0)
            self.hold = torch.minimum(self.budget - self.recent, self.key_limit) + self.recent - 1
            self.key_from_step = torch.zeros_like(self.hold)
        else:
            # Official: key tokens are the positions below key_limit from decode step key_from_step on (a prompt
            # that selects freezes them at once; a growing sequence at its first eviction, step hold - n).
            self.key_limit = torch.where(self.prompt_lengths > self.hold, self.prompt_lengths - self.recent,
                                         self.hold - self.protect + 1)
            self.key_from_step = torch.clamp(self.hold - self.prompt_lengths + 1, min=0)
        positions = valid.long().cumsum(-1) - 1
        self.prompt_positions = torch.where(valid, positions, -1)
        self.query_valid = valid
        # Sequences whose prompt is shorter than what they hold grow (no eviction) until they reach it.
        self.growing = self.decode_evicts and bool((self.hold > self.prompt_lengths).any())
        self._over = None  # growing: which sequences evict at this decode step
        # With equal budgets every slot is filled once the newcomer is written: no slot mask is needed.
        self.dense_slots = (self.decode_evicts and not self.growing and not self.variable_lengths
                            and bool((self.budget == self.budget[0]).all()))
        self.next_position = self.prompt_lengths.clone()  # original position of the next token
        self.step = -1
        self.score_work.reset()
        self.score_select_s = 0.0
        self.begin_sequence()
        # Pads get position 1, as transformers' generate does; they are masked anyway.
        return torch.where(valid, positions, 1)

    def next_positions(self) -> torch.Tensor:
        """Position ids for the token about to be decoded, (B, 1); advances the step counter."""
        self.step += 1
        self.current_position = self.next_position.clone()
        self.next_position = self.next_position + 1
        # tokens at positions above this floor are protected at this step's eviction (newcomer included)
        self._window_floor = (self.current_position - self.protect).view(-1, 1, 1)
        if self.growing:  # a sequence holding min(hold, n + s) tokens before step s evicts once n + s >= hold
            self._over = self.prompt_lengths + self.step >= self.hold
        if self.position_mode == "renumber" and self.evicts:
            # The newcomer sits right after the tokens held (StreamingLLM-style query position): k once full.
            if self.decode_evicts:
                held = torch.minimum(self.hold, self.prompt_lengths + self.step)
            else:
                held = torch.minimum(self.budget, self.prompt_lengths) + self.step
            return held.unsqueeze(-1)
        return self.current_position.unsqueeze(-1)

    def _newcomer_positions(self, batch: int, heads: int) -> torch.Tensor:
        return self.current_position.view(batch, 1, 1).expand(batch, heads, 1)

    def _reorder_sequences(self, beam_idx: torch.Tensor) -> None:
        self.prompt_groups = None  # after the prompt, beams are separate sequences
        for name in ("prompt_lengths", "budget", "recent", "hold", "protect", "key_limit", "key_from_step",
                     "_over", "next_position", "current_position", "_window_floor"):
            tensor = getattr(self, name, None)
            if tensor is not None:
                setattr(self, name, tensor.index_select(0, beam_idx.to(tensor.device)))

    # ---- the part every policy shares: score accumulation, selection, gather ------------------------
    @contextlib.contextmanager
    def _timed(self):
        if not self.profile:
            yield
            return
        start = time.perf_counter()
        yield
        self.score_select_s += time.perf_counter() - start

    def observe_attention(self, layer, logits: torch.Tensor, probs: torch.Tensor) -> None:
        """Called by the attention function with (B, H_kv, G, q, S) fp32 logits/probabilities, after the
        output has been computed; accumulates scores then selects (prefill) or evicts one (decode)."""
        if layer.window is not None:  # sliding-window layer: positional, no scores
            self.observe_scores(layer, None, 0)
            return
        with self._timed():
            increment = self.score_increment(logits, probs) if self.needs_scores else None
            elements = logits.numel() if increment is not None else 0
            if increment is not None:
                if layer.in_prefill and increment.shape[3] == logits.shape[3]:
                    # padded query rows attend to nothing real: they must not vote
                    increment = increment * self.query_valid[:, None, None, :, None]
                increment = reduce_queries(increment, self.gqa_reduce)
                check_finite(increment, self, layer.layer_idx)
        self.observe_scores(layer, increment, elements)

    def prompt_score_key(self):
        """What the prompt's scores depend on: every parameter but the budget's. Policies with equal keys score
        a prompt identically (and leave their random generator in the same state)."""
        params = {k: v for k, v in self.params().items() if k not in ("cache_ratio",)}
        return (type(self).__name__, tuple(sorted((k, repr(v)) for k, v in params.items())))

    def rng_state(self):
        """The state of the policy's random generator, if it has one (restored by a replayed prompt)."""
        return None

    def set_rng_state(self, state) -> None:
        pass

    def observe_scores(self, layer, increment: torch.Tensor | None, elements: int) -> None:
        """Select (prefill) or accumulate and evict (decode) from a reduced (B, H_kv, S) score; also the entry
        of a replayed prompt whose scores an earlier policy with the same scoring parameters computed
        (keyformer.generate)."""
        with self._timed():
            if layer.window is not None:
                layer.keep_window()
            elif layer.in_prefill:
                select = self._select_prompt_by_mask if self.variable_lengths else self._select_prompt
                select(layer, None if increment is None else self.finalize_prompt_scores(increment))
            else:
                if increment is not None:
                    if self.accumulates:
                        layer.scores += increment
                    else:
                        layer.scores.copy_(increment)
                (self._evict_by_mask if self.variable_lengths else self._evict_one)(layer)
            self.score_work.add(self.step, elements, elements * self.score_flops_per_element,
                                layer.positions.numel() if self.evicts and layer.window is None else 0)
        if self._observers:
            event = StepEvent(self.step, layer.layer_idx, layer.kept_positions(), layer.tokens_held())
            for fn in self._observers:
                fn(event)

    def _select_prompt(self, layer, prompt_scores: torch.Tensor | None) -> None:
        """Keep the last w real tokens plus the top (k - w) of the others, per sequence and KV head.

        Official selection keeps the last w - 1 and the top (k - w) of the first n - w (token n - w, the one
        the incoming token displaces from the window, is dropped), then freezes those keys. A prompt no longer
        than what a sequence holds (padded budget base) is kept whole; selection waits for the cache to grow."""
        batch, heads, n = layer.keys.shape[:3]
        device = layer.keys.device
        positions = self.prompt_positions.to(device)
        pos = positions.unsqueeze(1).expand(batch, heads, n)
        ranking = self.priority(pos, prompt_scores).float()
        lengths = self.prompt_lengths.to(device).view(batch, 1, 1)
        recent = pos >= lengths - self.protect.to(device).view(batch, 1, 1)
        ranking = torch.where(recent, math.inf, ranking)
        keep = torch.minimum(self.hold, self.prompt_lengths).to(device)  # tokens each sequence keeps now
        if self.frozen_keys:
            selects = (self.prompt_lengths > self.hold).to(device).view(batch, 1, 1)
            displaced = selects & (pos == lengths - self.recent.to(device).view(batch, 1, 1))
            ranking = torch.where(displaced, -FROZEN, ranking)
        ranking = torch.where(pos < 0, -math.inf, ranking)  # padding is never kept
        kept = int(keep.max())
        keep_idx = ranking.topk(kept, dim=-1).indices  # sorted: recent first, then by priority
        keep_valid = torch.arange(kept, device=device).view(1, kept) < keep.view(batch, 1)
        layer.compact(keep_idx, keep_valid, positions, prompt_scores, extra_slots=int(self.hold.max()) + 1 - kept)

    def _evict_one(self, layer) -> None:
        """Evict the lowest-priority token outside the protected window, one per (sequence, KV head); a
        sequence still below what it holds (growing) evicts nothing and fills its next empty slot."""
        if not self.decode_evicts:  # full, or a prompt-time-only policy: the cache grows
            layer.free_slot = layer.free_slot + 1
            return
        pos = layer.positions
        protected = pos > self._window_floor  # the w newest tokens (official: w - 1), newcomer included
        if not self.dense_slots:
            protected |= pos < 0  # sequences with a smaller budget than the batch maximum
        priority = self.priority(pos, layer.scores)
        if self.frozen_keys:
            active = (self.key_from_step <= self.step).to(pos.device).view(-1, 1, 1)
            frozen = (pos >= 0) & (pos < self.key_limit.to(pos.device).view(-1, 1, 1))
            # Frozen keys stay; among the others the token that left the window goes (oldest first).
            priority = torch.where(active, torch.where(frozen, FROZEN, pos.float()), priority)
        ranking = torch.where(protected, math.inf, priority)  # one pass
        slot = ranking.min(dim=-1).indices  # min().indices: about twice as fast as argmin on CPU
        if self.growing and not bool(self._over.all()):
            over = self._over.to(pos.device).view(-1, 1)
            slot = torch.where(over, slot, (pos < 0).int().argmax(dim=-1))  # or fill the next empty slot
        layer.evict(slot)

    def _select_prompt_by_mask(self, layer, prompt_scores: torch.Tensor | None) -> None:
        """Variable lengths: keep what `keep_mask` keeps of the prompt (the last w real tokens always), per
        sequence and KV head, in a buffer of slot_capacity + 1 slots (at least one empty)."""
        batch, heads, n = layer.keys.shape[:3]
        device = layer.keys.device
        positions = self.prompt_positions.to(device)
        pos = positions.unsqueeze(1).expand(batch, heads, n)
        lengths = self.prompt_lengths.to(device).view(batch, 1, 1)
        protected = (pos >= 0) & (pos >= lengths - self.protect.to(device).view(batch, 1, 1))
        keep = (self.keep_mask(layer, pos, prompt_scores, protected) | protected) & (pos >= 0)
        counts = keep.sum(-1)  # (B, H)
        kept = int(counts.max())
        keep_idx = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[..., :kept]  # kept ones, in order
        keep_valid = torch.arange(kept, device=device).view(1, 1, kept) < counts.unsqueeze(-1)
        extra = max(1, self.slot_capacity(layer.layer_idx) + 1 - kept)
        layer.compact(keep_idx, keep_valid, positions, prompt_scores, extra_slots=extra)

    def _evict_by_mask(self, layer) -> None:
        """Variable lengths: after the newcomer was scored, empty every slot `keep_mask` drops (none, one or
        many per head); the next token goes to the first empty slot (SlotLayer grows a full buffer). A policy
        that selects at the prompt only (`evicts_while_decoding` False) keeps every token."""
        pos = layer.positions
        valid = pos >= 0
        if not self.decode_evicts:
            empty = ~valid
            layer.free_slot = torch.where(empty.any(-1), empty.to(torch.int8).argmax(-1), pos.shape[-1])
            return
        protected = valid & (pos > self._window_floor)  # the w newest tokens, newcomer included
        drop = valid & ~(self.keep_mask(layer, pos, layer.scores, protected) | protected)
        layer.positions.masked_fill_(drop, -1)
        layer.scores.masked_fill_(drop, 0.0)
        empty = layer.positions < 0
        slots = pos.shape[-1]
        layer.free_slot = torch.where(empty.any(-1), empty.to(torch.int8).argmax(-1), slots)
