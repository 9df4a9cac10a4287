"""What a software-stack profile is (`Profile`) and the registry the profile modules add themselves to.

A `Profile` says how many kernels each core operator launches, whether attention scores go through
memory, how much activation workspace a prefill holds, and may add operators of its own through two
hooks that receive the pass's `sim.op.OpContext` and return `sim.op.Op` rows:

    def extra_decode_ops(ctx) -> list[Op]     # e.g. cache concatenation copies, beam reordering
    def extra_prefill_ops(ctx) -> list[Op]    # e.g. fp32 upcasts, n x n mask materialisation
    def extra_memory_bytes(setup, rows, kv_tokens, prompt) -> bytes   # e.g. eager score matrices

OpContext fields may be numpy arrays (one value per design point, decode step and, with a trace, layer):
write hooks as plain arithmetic on them, as sim/ops.py does.
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
    # engine profiles (sim/profiles/engines.py): the engine's own per-step and per-launch overheads in place
    # of the device file's assumptions (None: the device's), and adjust_ops(ctx, ops), which sets an op's
    # Op.compute_eff / compute_scale / bw_scale (the engine's kernel rates; factors in (0, 1])
    host_overhead_s: float | None = None
    launch_overhead_s: float | None = None
    adjust_ops: Callable | None = None
    # decode: the attention kernel accumulates the H2O/Keyformer scores from its own softmax (no pass of
    # its own over the probabilities; sim.policies.scored.ScoredPolicy.decode_ops)
    score_in_attention: bool = False
    # prefill: an evicting policy compresses each layer's cache right after that layer's prefill (kvpress-
    # style forward hooks), so the prefill peak is one layer at the prompt and the others at what they keep
    # (sim.engine.memory.peak_kv_tokens); False: every layer holds the whole prompt until the prefill ends
    layerwise_prefill_eviction: bool = False
    # engine profiles: the engine and its term values (sim/profiles/engines.py), so a published row can run
    # the same terms under its own stack's runtime and kernels (sim.validation.published_gpu.row_profile)
    engine: str | None = None
    terms: tuple | None = None    # ((name, value), ...)

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
# The core operators of one decode attention (sim/ops.py): what a profile's own attention rate applies to
DECODE_ATTENTION_OPS = ("attn_scores", "softmax", "attn_v")


def read_fit_yaml(path, what: str, command: str) -> dict:
    """A fitted profile's YAML file as a mapping; one-line errors that say which command writes it."""
    from pathlib import Path

    import yaml
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} not found (run {command})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    return data


def register_profile(profile: Profile) -> Profile:
    PROFILES[profile.name] = profile
    return profile
