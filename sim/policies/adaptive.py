"""Adaptive-budget policies (mass, pyramidkv, adakv; keyformer/mass.py, pyramidkv.py, adakv.py): how many
tokens a KV head holds depends on what the model attended to, so their lengths per decode step, layer and
head come from traces; the formula (no trace) is each paper's default where it gives one.

The engine takes one length per decode step and layer (`kv_override`, tokens per KV head). A layer whose
heads hold different numbers of tokens costs what its attention kernel reads:
- `attn_kernel="ragged"` (default, today's behaviour for every policy): a varlen kernel reads each head's own
  tokens, so the layer's length is the mean over its heads (the trace read with heads="mean");
- `attn_kernel="padded"`: a dense kernel (and a dense buffer, as keyformer/'s slot cache pads each layer to
  its fullest head) pads every head to the longest, so the layer's length is the max over its heads
  (heads="max"). Memory follows the same length (the padding is allocated).

    policy = dataclasses.replace(sim.policies.get("adakv"), attn_kernel="padded")
    override = policy.trace_lengths(trace, 0.5, prompt=2048, gen=256, model=model)   # (gen + 1, n_layers)
    engine.predict(hw, model, 8, 2048, 256, "adakv", 0.5, kv_override=override)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from sim.models import windowed_per_layer
from sim.op import SCORE_BYTES, Op, OpContext
from sim.op import launch_count as _launch
from sim.policies.scored import ScoredPolicy

ATTN_KERNELS = ("ragged", "padded")
FORMULA_RECENT_RATIO = 0.3  # keyformer/'s default recent window, for the formula's per-layer split


def load_trace(trace):
    """A traces.Trace, or a trace folder opened with traces.load."""
    if hasattr(trace, "kv_override_per_sample"):
        return trace
    import traces
    return traces.load(trace)


@dataclass(frozen=True)
class AdaptivePolicy(ScoredPolicy):
    """A scored policy whose per-head lengths vary; formula lengths are k per head unless a subclass says."""
    attn_kernel: str = "ragged"
    adaptive: ClassVar[bool] = True
    # selection sorts the candidates of a head (mass) or of a layer (adakv) instead of taking one minimum
    sorts: ClassVar[bool] = False
    # printed under a prediction that used the formula (sim.predict), when the formula is not the policy's
    formula_note: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if self.attn_kernel not in ATTN_KERNELS:
            raise ValueError(f"attn_kernel must be one of {', '.join(ATTN_KERNELS)}, got {self.attn_kernel!r}")

    def with_attn_kernel(self, attn_kernel: str) -> "AdaptivePolicy":
        return replace(self, attn_kernel=attn_kernel)

    @property
    def trace_heads(self) -> str:
        """How a trace's heads of one layer make its length: "mean" (ragged) or "max" (padded)."""
        return "mean" if self.attn_kernel == "ragged" else "max"

    # --- lengths per decode step and layer: (gen + 1, n_layers), row r = what decode step r reads ---
    def layer_budgets(self, k, w, prompt, n_layers: int) -> np.ndarray:
        """(n_layers,) tokens per KV head each layer holds once full: k everywhere (pyramidkv overrides)."""
        return np.full(n_layers, float(k))

    def formula_lengths(self, prompt: int, gen: int, cache_ratio: float, model,
                        recent_ratio: float = FORMULA_RECENT_RATIO) -> np.ndarray:
        """Without a trace: each layer's budget (min with what exists), the same for every head, so ragged
        and padded agree. mass has no formula length: this is its cap k."""
        k = float(self.budget(prompt, cache_ratio))
        w = float(np.floor(recent_ratio * k))
        per_layer = self.layer_budgets(k, w, prompt, model.n_layers)
        exists = float(prompt) + np.arange(gen + 1, dtype=float)[:, None]
        return windowed_per_layer(model, np.minimum(exists, per_layer[None, :]))

    def trace_lengths(self, trace, cache_ratio: float, prompt: int, gen: int, model, *, label: str | None = None,
                      sample=None) -> np.ndarray:
        """From a trace (folder or traces.Trace) captured with this policy (`label`: a variant's label,
        default the name): the mean over samples (or one `sample`) of each layer's mean head (ragged) or
        fullest head (padded), mapped onto `model`, `prompt` and `gen` (docs/traces.md)."""
        out = load_trace(trace).kv_override(label or self.name, cache_ratio, prompt=prompt, gen=gen,
                                            n_layers=model.n_layers, sample=sample, heads=self.trace_heads)
        return windowed_per_layer(model, out)

    def trace_lengths_per_sample(self, trace, cache_ratio: float, prompt: int, gen: int, model, *,
                                 label: str | None = None) -> tuple[np.ndarray, list[str]]:
        """One (gen + 1, n_layers) array per captured sample (the DES's per-request lengths) and the ids."""
        per_sample, ids = load_trace(trace).kv_override_per_sample(label or self.name, cache_ratio, prompt, gen,
                                                                   model.n_layers, heads=self.trace_heads)
        return windowed_per_layer(model, per_sample), ids

    def decode_ops(self, ctx: OpContext) -> list[Op]:
        ops = super().decode_ops(ctx)
        if not self.sorts:
            return ops
        m = ctx.model
        kept = ctx.past_tokens + 1.0
        candidates = ctx.rows * m.n_kv_heads * kept
        # a sort of every held score (mass: per head, with a prefix sum; adakv: over the layer's heads)
        sort = Op("select_evict", True, flops=candidates * np.log2(np.maximum(kept, 2.0)),
                  act_bytes=3 * candidates * SCORE_BYTES, launches=_launch(ctx, "select_evict"))
        return [op if op.name != "select_evict" else sort for op in ops]
