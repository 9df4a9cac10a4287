"""Software-stack profiles: the same chip runs different code.

A `Profile` says how many kernels each core operator launches, whether attention scores go through
memory, how much activation workspace a prefill holds, and may add operators of its own through two
hooks that receive the pass's `sim.ops.OpContext` and return `sim.ops.Op` rows:

    def extra_decode_ops(ctx) -> list[Op]     # e.g. cache concatenation copies, beam reordering
    def extra_prefill_ops(ctx) -> list[Op]    # e.g. fp32 upcasts, n x n mask materialisation
    def extra_memory_bytes(setup, rows, kv_tokens, prompt) -> bytes   # e.g. eager score matrices

OpContext fields may be numpy arrays (one value per design point, decode step and, with a trace, layer):
write hooks as plain arithmetic on them, as sim/ops.py does.

Another module registers its profile with `register_profile(Profile(...))`; the engine needs no change.
`fused` (the default) is ideal kernels: one pass over the weights and the kept KV per step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

CORE_OPS = ("embed", "norms", "qkv_proj", "kv_write", "attn_scores", "softmax", "attn_v", "score_update",
            "select_evict", "select_topk", "compact", "out_proj", "mlp", "final_norm", "lm_head")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    launches: Mapping[str, float] = field(default_factory=dict)   # kernels per occurrence; missing -> 1
    materialise_scores: bool = False      # attention scores written to / read from memory (eager attention)
    prefill_chunk_tokens: int | None = 8192   # activation workspace bound (tokens per prefill chunk); None: all
    extra_host_overhead_s: float = 0.0    # per step, on top of the device's host overhead (e.g. Python loop)
    extra_decode_ops: Callable | None = None
    extra_prefill_ops: Callable | None = None
    # extra_memory_bytes(setup, rows, kv_tokens, prompt) -> bytes the stack holds on top of weights, KV,
    # scores and workspace (e.g. eager n x n attention matrices); must grow with rows (max_batch bisects)
    extra_memory_bytes: Callable | None = None
    # eager PyTorch code: each launch is a top-level call of model code, charged the device's calibrated
    # eager_call_overhead_s (allocation, nested aten calls, nn.Module machinery, Python between calls)
    # where the hardware file has it, else launch_overhead_s like any kernel launch
    eager: bool = False
    # engine profiles (sim/profile_engines.py): the engine's own per-step and per-launch overheads in place
    # of the device file's assumptions (None: the device's), and adjust_ops(ctx, ops), which sets an op's
    # Op.compute_eff / compute_scale / bw_scale (the engine's kernel rates; factors in (0, 1])
    host_overhead_s: float | None = None
    launch_overhead_s: float | None = None
    adjust_ops: Callable | None = None
    # decode: the attention kernel accumulates the H2O/Keyformer scores from its own softmax (no pass of
    # its own over the probabilities; sim.ops.policy_decode_ops)
    score_in_attention: bool = False

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError("profile name must be a non-empty string")
        unknown = set(self.launches) - set(CORE_OPS)
        if unknown:
            raise ValueError(f"profile {self.name}: launches for unknown ops {sorted(unknown)}; core ops: {CORE_OPS}")
        if any(v < 0 for v in self.launches.values()):
            raise ValueError(f"profile {self.name}: launch counts must be >= 0")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens <= 0:
            raise ValueError(f"profile {self.name}: prefill_chunk_tokens must be positive or None")
        if self.extra_host_overhead_s < 0:
            raise ValueError(f"profile {self.name}: extra_host_overhead_s must be >= 0")
        for name in ("host_overhead_s", "launch_overhead_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"profile {self.name}: {name} must be >= 0")


PROFILES: dict[str, Profile] = {}


def register_profile(profile: Profile) -> Profile:
    PROFILES[profile.name] = profile
    return profile


def get_profile(name_or_profile) -> Profile:
    if isinstance(name_or_profile, Profile):
        return name_or_profile
    if name_or_profile not in PROFILES:
        _load_plugins()
    try:
        return PROFILES[name_or_profile]
    except KeyError:
        raise ValueError(f"unknown profile {name_or_profile!r}; registered: {', '.join(sorted(PROFILES))}") from None


def _load_plugins():
    """Profiles shipped in other sim modules register themselves on import (e.g. hf-eager)."""
    import importlib
    for module in ("sim.profile_hf_eager", "sim.profile_engines", "sim.profile_hf"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:      # the plugin exists but is broken: say so
                raise


register_profile(Profile(
    name="fused",
    description="ideal fused kernels (vLLM/TensorRT-LLM class): one flash-attention kernel per layer "
                "(scores, softmax and attn x V on chip; in decode it also accumulates the H2O/Keyformer scores), "
                "one selection kernel per layer, fused gate+up MLP, logits for the last token only, "
                "prefill activations bounded by 8192-token chunks",
    launches={"embed": 1, "norms": 2, "qkv_proj": 1, "kv_write": 1, "attn_scores": 1, "softmax": 0, "attn_v": 0,
              "out_proj": 1, "mlp": 2, "final_norm": 1, "lm_head": 1, "score_update": 1, "select_evict": 1,
              "select_topk": 1, "compact": 1},
    score_in_attention=True,
))
