"""The timing grid: which policies, batches and contexts are measured, and how (repeats, threads, dtype,
stack). Each setting is declared once (kvcommon.fields): its help, check and flag feed both TimingGrid's
own check (errors name fields) and `python -m traces.timing`'s flags (errors name flags)."""
from __future__ import annotations

from dataclasses import dataclass

from kvcommon.design import CACHE_RATIO_RANGE
from kvcommon.fields import FieldError, at_least, param, validate
from kvcommon.variants import PolicyVariant
from traces.timing_format import TimingError

DEFAULT_MODELS = ("gpt2-small-rand", "llama-gqa-rand", "wide-mha-rand")
DEFAULT_BATCHES = (1, 2, 4, 8)
DEFAULT_CONTEXTS = (256, 1024, 4096)
DEFAULT_POLICIES = ("full", "keyformer:0.2", "keyformer:0.5", "keyformer:1.0")
DEFAULT_PREFILL = (64, 256)
STACKS = ("kvsim", "hf")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
# the HF stack's defaults: every point pays a prefill of batch x beams x context tokens, so shorter contexts
HF_DEFAULTS = dict(batches=(1,), contexts=(256, 1024, 2048), policies=("full",), prefill=(), beams=4)
TORCH_DTYPES = ("fp32", "bf16", "fp16")     # keyformer.dtypes.TORCH_DTYPE_NAMES (this module is torch-free)


@dataclass(frozen=True)
class PolicyPoint:
    name: str  # a keyformer.make_policy name
    ratio: float  # KV budget as a fraction of the context (1.0 for full)

    @classmethod
    def parse(cls, text: str) -> "PolicyPoint":
        """`full`, `keyformer:0.5`, `h2o:cache_ratio=0.2`, ... (ratio in (0, 1]): the one policy-variant
        grammar (kvcommon.variants), whose bare value here is the cache ratio (the documented NAME:RATIO)."""
        try:
            variant = PolicyVariant.parse(text, positional="cache_ratio")
        except ValueError:
            raise TimingError(f"bad --policy {text!r}: expected NAME or NAME:RATIO, e.g. keyformer:0.5") from None
        name, ratio = variant.name, variant.params.get("cache_ratio")
        if set(variant.params) - {"cache_ratio"}:
            raise TimingError(f"bad --policy {text!r}: the timing grid varies the cache ratio only")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float, type(None))):
            raise TimingError(f"bad --policy {text!r}: ratio {ratio!r} is not a number")
        if name == "full":
            if ratio is not None and float(ratio) != 1.0:
                raise TimingError(f"bad --policy {text!r}: full keeps the whole context (ratio 1.0)")
            return cls("full", 1.0)
        if ratio is None:
            raise TimingError(f"bad --policy {text!r}: {name} needs a ratio, e.g. {name}:0.5")
        if CACHE_RATIO_RANGE(ratio):
            raise TimingError(f"bad --policy {text!r}: ratio must be in (0, 1]")
        return cls(name, float(ratio))

    def label(self) -> str:
        return self.name if self.name == "full" else f"{self.name}:{self.ratio:g}"


@dataclass(frozen=True)
class TimingGrid:
    batches: tuple[int, ...] = param(DEFAULT_BATCHES, flag="--batch", list=True, check=at_least(1),
                                     help=f"comma-separated batch sizes (default {','.join(map(str, DEFAULT_BATCHES))}; "
                                          f"--stack hf: {','.join(map(str, HF_DEFAULTS['batches']))})")
    contexts: tuple[int, ...] = param(DEFAULT_CONTEXTS, flag="--context", list=True, check=at_least(1),
                                      help=f"comma-separated context lengths held before the timed step (default "
                                           f"{','.join(map(str, DEFAULT_CONTEXTS))}; --stack hf: "
                                           f"{','.join(map(str, HF_DEFAULTS['contexts']))})")
    policies: tuple[PolicyPoint, ...] = param(tuple(PolicyPoint.parse(p) for p in DEFAULT_POLICIES), flag="--policy",
                                              help=f"NAME or NAME:RATIO, repeatable (default: "
                                                   f"{' '.join(DEFAULT_POLICIES)}; --stack hf: full)")
    prefill_contexts: tuple[int, ...] = param(DEFAULT_PREFILL, flag="--prefill", list=True, check=at_least(2),
                                              help="prefill lengths timed at batch 1 ('none' to skip; default "
                                                   f"{','.join(map(str, DEFAULT_PREFILL))}, none for --stack hf)")
    repeats: int = param(7, help="timed steps per point (median reported)", check=at_least(1))
    warmup: int = param(2, help="untimed steps before each point", check=at_least(0))
    threads: int = param(1, help="torch intra-op threads (recorded)", check=at_least(1))
    dtype: str = param("fp32", help="weights and KV dtype: fp32, bf16 or fp16", choices=TORCH_DTYPES)
    device: str = param("cpu", help="cpu or cuda[:N]")
    seed: int = param(0)
    # "kvsim": keyformer/'s slot cache; "hf": transformers' generate (beam search)
    stack: str = param("kvsim", choices=STACKS,
                       help="kvsim: the project's policies on its slot cache (default); hf: steps of transformers' "
                            "own generate with beam search (full cache), predicted with the hf-eager profile")
    beams: int = param(1, check=at_least(1), help=f"beam width for --stack hf (default {HF_DEFAULTS['beams']})")
    # --stack hf: transformers' attention implementation ("sdpa": its default)
    attn: str = param("eager", choices=ATTN_IMPLEMENTATIONS,
                      help="--stack hf: transformers' attention implementation (sdpa = its default; with --beams 1 "
                           "the folder is predicted under the hf profile, else hf-eager)")

    def __post_init__(self):
        if not self.batches or not self.contexts:
            raise FieldError("batches" if not self.batches else "contexts", "must hold at least one value", [])
        validate(self)
        # the rules between fields (each error names the field whose value breaks it)
        if self.stack == "kvsim" and self.beams != 1:
            raise FieldError("beams", "needs stack hf (the project's decode step is greedy)", self.beams)
        if self.stack == "hf" and any(p.name != "full" for p in self.policies):
            raise FieldError("policies", "must be full only with stack hf (transformers' own cache evicts nothing)",
                             [p.label() for p in self.policies])
        if self.stack == "hf" and self.prefill_contexts:
            raise FieldError("prefill_contexts", "must be none with stack hf (it times decode steps only)",
                             list(self.prefill_contexts))
        if self.attn != "eager" and self.stack != "hf":
            raise FieldError("attn", "needs stack hf (the project's policies need eager attention)", self.attn)

    def decode_points(self) -> list[dict]:
        return [dict(phase="decode", policy=p.name, cache_ratio=p.ratio, batch=int(b), context=int(n))
                for p in self.policies for n in self.contexts for b in self.batches]

    def prefill_points(self) -> list[dict]:
        # Prefill is timed under `full` at batch 1: the compute-bound regime the decode grid never reaches.
        return [dict(phase="prefill", policy="full", cache_ratio=1.0, batch=1, context=int(n))
                for n in self.prefill_contexts]

    def settings(self) -> dict:
        """What must match for points to be comparable (checked when resuming into an existing folder)."""
        settings = {"repeats": self.repeats, "warmup": self.warmup, "threads": self.threads,
                    "dtype": self.dtype, "device": self.device, "seed": self.seed}
        # only when not the default: folders measured before the HF stack existed keep resuming
        return (settings | ({"stack": self.stack, "beams": self.beams} if self.stack != "kvsim" else {})
                | ({"attn": self.attn} if self.attn != "eager" else {}))

    @property
    def software(self) -> str:
        """The sim profile of the code that runs: hf (transformers defaults: sdpa, greedy), hf-eager, kvsim-eager."""
        if self.stack != "hf":
            return "kvsim-eager"
        return "hf" if self.attn == "sdpa" and self.beams == 1 else "hf-eager"
