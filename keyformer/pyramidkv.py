"""PyramidKV (Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
Funneling"; Zefan-Cai/PyramidKV `PyramidKVCluster`): layer budgets that decrease linearly with depth, lower
layers (broad attention) keeping more, upper ones (attention funnelled onto few tokens) less, their mean
the budget k. Within a layer the selection is H2O's: accumulated attention scores plus the recent window.

Schedule (the released code's, with its beta = 20): the part above the window, e = k - w, goes from
x_top = floor(e / beta) at the last layer to x_bottom = 2 e - x_top at the first, linearly, rounded so the
layers sum to L * k exactly (largest remainders; the schedule stays non-increasing). If the first layer
would hold more than the prompt, the pyramid flattens (x_bottom = n - w, x_top = 2 e - x_bottom) so that
the mean stays k (k = n gives n everywhere). Departure from the paper: its selection is SnapKV's
observation-window vote at the prompt only, then the cache grows; here every decode step evicts, as H2O
does, so each layer holds its budget and the policy compares with h2o at the same mean memory."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from keyformer.base import Policy
from keyformer.scoring import top_by_rank
from kvcommon.score_costs import SCORE_FLOPS_PER_ELEMENT


def pyramid_budgets(budget: torch.Tensor, recent: torch.Tensor, ceiling: torch.Tensor, n_layers: int,
                    beta: float = 20.0) -> torch.Tensor:
    """(B, n_layers) long per-layer budgets for budgets k, windows w and the most a layer may hold (B,)."""
    budget, recent, ceiling = (t.long().view(-1, 1) for t in (budget, recent, ceiling))
    extra = budget - recent  # e = k - w
    if n_layers == 1:
        return budget.clone()
    top = torch.floor(extra.double() / beta)
    bottom = torch.minimum(2 * extra.double() - top, (ceiling - recent).double())
    top = 2 * extra.double() - bottom
    depth = torch.arange(n_layers, dtype=torch.float64, device=budget.device).view(1, -1) / (n_layers - 1)
    exact = bottom + (top - bottom) * depth  # (B, L), mean e
    base = torch.floor(exact + 1e-9)
    missing = (extra * n_layers - base.sum(-1, keepdim=True).long()).clamp(min=0)  # units to hand out
    frac = exact - base
    # largest remainders first, ties to the lower layer (keeps the schedule non-increasing)
    order = torch.argsort(-frac + depth * 1e-6, dim=-1, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(n_layers, device=budget.device).expand_as(order)
                                            .contiguous())
    return recent + base.long() + (rank < missing).long()


@dataclass
class PyramidKVPolicy(Policy):
    beta: float = 20.0  # top layer's share above the window: (k - w) / beta (the released code's default)
    name: ClassVar[str] = "pyramidkv"
    needs_scores: ClassVar[bool] = True
    variable_lengths: ClassVar[bool] = True
    score_flops_per_element: ClassVar[int] = SCORE_FLOPS_PER_ELEMENT["pyramidkv"]  # counted in kvcommon.score_costs

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta < 1:
            raise ValueError(f"beta must be >= 1, got {self.beta}")

    def global_layers(self) -> list[int]:
        """The layers the pyramid spans: all but the sliding-window ones (which keep their window)."""
        return [i for i, layer in enumerate(self.layers) if layer.window is None]

    def layer_budgets(self) -> torch.Tensor:
        """(B, n_global_layers) tokens each global layer holds per KV head once full (mean over them = k),
        from the lowest global layer to the highest (every layer when the model has no sliding-window ones)."""
        ceiling = torch.maximum(self.prompt_lengths, self.hold)
        return pyramid_budgets(self.hold, self.protect, ceiling, len(self.global_layers()), self.beta)

    def _depth(self, layer_idx: int) -> int:
        return self.global_layers().index(layer_idx)

    def score_increment(self, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        return probs

    def priority(self, positions: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        return scores

    def slot_capacity(self, layer_idx: int) -> int:
        return int(self.layer_budgets()[:, self._depth(layer_idx)].max())

    def keep_mask(self, layer, positions, scores, protected):
        budget = self.layer_budgets()[:, self._depth(layer.layer_idx)].to(positions.device).view(-1, 1)
        ranking = torch.where(positions >= 0, scores, -torch.inf)
        ranking = torch.where(protected, torch.inf, ranking)
        return top_by_rank(ranking, budget.expand(positions.shape[:2]))
