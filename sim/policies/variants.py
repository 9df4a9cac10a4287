"""Policy variants in the simulator: `h2o:recent_ratio=0.2`, `keyformer:selection=official`,
`keyformer(budget_base=padded)` (either spelling, kvcommon.variants) in --policy of sim.predict and sim.serve
and in sim.sweep --policies, the same grammar traces.capture and keyformer.generate take.

Which keys a policy takes is what its keyformer/ class declares (kvcommon.policy_params reads the classes'
source: no torch, no second list). How the simulator treats them:
- `recent_ratio` changes what is kept: it is the design point's recent ratio (DesignPoint.recent_ratio, the
  recent window w = floor(r k) of the policy's operators; `resolve` maps it there) and, with --trace, part of
  the label the trace's rows are read under;
- `budget_base`, `pad_length` change the budget: k = floor(p max(pad_length, n)) with budget_base=padded
  (SimPolicy.budget), so a prompt shorter than pad_length keeps more, and grows from n towards k;
- every other key (selection=official, noise=..., tau_*, seed, position_mode, gqa_reduce, n_sinks, window,
  kernel, pooling, mass, beta, ...) changes only which tokens are chosen: the formula's KV lengths and
  operators are the base policy's. The variant is still its own label in every output, and with --trace the
  lengths are the ones measured under it.
The simulator's policy string is the stored label (`keyformer(selection=official)`), the form trace folders
and sweep tables keep, so a label a trace names can be passed back as it is.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from kvcommon.design import DEFAULT_RECENT_RATIO, RECENT_RATIO_RANGE
from kvcommon.policy_params import read_policy_parameters
from kvcommon.variants import PolicyVariant, VariantParam, check_variant

# keys a variant may not set: they have their own flag
RESERVED = {"cache_ratio": "give it with --cache-ratio"}
KV_KEYS = ("recent_ratio",)                 # change what is kept (mapped onto the design point)
BUDGET_KEYS = ("budget_base", "pad_length")  # change the budget k (SimPolicy.budget)


def keyformer_folder() -> Path:
    """The keyformer package's folder, found without importing it (it imports torch)."""
    spec = importlib.util.find_spec("keyformer")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("policy variants need the keyformer package's source (not found)")
    return Path(next(iter(spec.submodule_search_locations)))


def parameters(name: str) -> dict[str, VariantParam]:
    """The parameters policy `name`'s keyformer/ class declares (name -> VariantParam)."""
    return read_policy_parameters(keyformer_folder()).get(name, {})


def read_variant(text, names) -> PolicyVariant:
    """A checked variant of one of `names` from either spelling (a ValueError of one line otherwise)."""
    variant = PolicyVariant.read(text)
    if variant.name not in names:
        raise ValueError(f"unknown policy {variant.name!r}; expected one of {', '.join(names)}")
    # a bare name needs no keyformer/ source (a simulator-only install still runs every base policy)
    return check_variant(variant, parameters(variant.name), RESERVED) if variant.params else variant


def resolve(text, names, recent_ratio: float | None = None) -> tuple[PolicyVariant, float]:
    """(the variant, the design point's recent ratio) for --policy `text` and --recent-ratio `recent_ratio`
    (None: not given): `h2o:recent_ratio=0.2` sets the recent ratio; with a different --recent-ratio as well
    it is a ValueError naming both."""
    variant = read_variant(text, names)
    own = variant.get("recent_ratio")
    if own is not None and (isinstance(own, bool) or RECENT_RATIO_RANGE(own)):
        raise ValueError(f"policy {variant.name}: recent_ratio must be in [0, 1], got {own!r}")
    if own is None:
        return variant, DEFAULT_RECENT_RATIO if recent_ratio is None else recent_ratio
    if recent_ratio is not None and float(recent_ratio) != float(own):
        raise ValueError(f"--policy {text} sets recent_ratio={own} and --recent-ratio {recent_ratio:g} another: "
                         "give one")
    return variant, float(own)


def require_cache_ratio(variant: PolicyVariant, cache_ratio: float | None) -> float:
    """The one rule of every CLI: a policy that keeps a budget needs --cache-ratio (no silent 1.0); full
    attention keeps everything (1.0)."""
    if cache_ratio is not None:
        return cache_ratio
    if variant.name == "full":
        return 1.0
    raise ValueError(f"--policy {variant.name} needs --cache-ratio (the KV budget, a fraction of the prompt in (0, 1])")


def policy_help(names) -> str:
    """--policy's help in every sim CLI: the names (from the one registry) and the variant grammar."""
    return (f"KV-cache policy, one of {', '.join(names)}, or a variant name:key=value,... of its keyformer/ "
            "parameters (keyformer:selection=official, keyformer:budget_base=padded, h2o:recent_ratio=0.2; "
            "a trace's label keyformer(noise=none) too)")


RECENT_RATIO_HELP = ("recent window as a fraction of the budget, [0, 1]; a variant's recent_ratio sets it "
                     f"(default: {DEFAULT_RECENT_RATIO:g})")
CACHE_RATIO_HELP = "KV budget as a fraction of the prompt, (0, 1]; required for every policy but full"


def design_point(args, names):
    """(kvcommon.DesignPoint, the variant) of parsed sim.predict-style flags: --policy read as a variant (its
    recent_ratio onto the point's recent ratio, its other keys into policy_params), the one --cache-ratio
    rule, every field's check worded with its flag."""
    from kvcommon import DesignPoint
    from kvcommon.fields import from_args
    variant, recent = resolve(args.policy, names, args.recent_ratio)
    point = from_args(DesignPoint, args, policy=variant.name, policy_params=variant.params, recent_ratio=recent,
                      cache_ratio=require_cache_ratio(variant, args.cache_ratio))
    return point, variant
