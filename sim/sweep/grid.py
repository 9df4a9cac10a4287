"""The sweep's grid: its axes (`GridConfig`, the YAML keys) and their cartesian product (`build_grid`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from hwmodels.dtypes import canonical_dtype
from kvcommon.design import CACHE_RATIO_RANGE, DEFAULT_DTYPE, DEFAULT_PROFILE, DEFAULT_RECENT_RATIO, RECENT_RATIO_RANGE
from sim.models import load_model
from sim.policies import NAMES as POLICIES
from sim.policies import get as get_policy
from sim.policies import label as policy_label

DEFAULT_MODELS = ["llama-2-7b", "llama-3-8b", "mpt-7b", "gpt-j-6b"]
DEFAULT_RATIOS = [round(0.1 * i, 1) for i in range(1, 11)]


def datasheet_devices() -> list[str]:
    """Every shipped device except measured local ones (cpu-*)."""
    from hwmodels import list_devices
    return [name for name in list_devices() if not name.startswith("cpu")]


@dataclass
class GridConfig:
    """Axes of a cartesian grid; every list must be non-empty. YAML files use the same keys."""
    hw: list = field(default_factory=datasheet_devices)
    models: list = field(default_factory=lambda: list(DEFAULT_MODELS))
    policies: list = field(default_factory=lambda: list(POLICIES))
    cache_ratios: list = field(default_factory=lambda: list(DEFAULT_RATIOS))
    batches: list = field(default_factory=lambda: [1, 8, 32, 128])
    prompts: list = field(default_factory=lambda: [1024, 4096])
    gens: list = field(default_factory=lambda: [256, 1024])
    recent_ratios: list = field(default_factory=lambda: [DEFAULT_RECENT_RATIO])
    beams: list = field(default_factory=lambda: [1])
    kv_dtypes: list = field(default_factory=lambda: [DEFAULT_DTYPE])
    weight_dtypes: list = field(default_factory=lambda: [DEFAULT_DTYPE])
    profiles: list = field(default_factory=lambda: [DEFAULT_PROFILE])

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (str, int, float)):
                value = [value]
                setattr(self, f.name, value)
            if not isinstance(value, list) or not value:
                raise ValueError(f"grid {f.name}: expected a non-empty list, got {value!r}")
        for name in ("batches", "prompts", "gens", "beams"):
            for v in getattr(self, name):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                    raise ValueError(f"grid {name}: expected positive integers, got {v!r}")
        # the ranges are kvcommon.DesignPoint's (one check per parameter)
        for name, check, interval in (("cache_ratios", CACHE_RATIO_RANGE, "(0, 1]"),
                                      ("recent_ratios", RECENT_RATIO_RANGE, "[0, 1]")):
            for v in getattr(self, name):
                if isinstance(v, bool) or not isinstance(v, (int, float)):   # e.g. a list inside the list
                    raise ValueError(f"grid {name}: expected numbers in {interval}, got {v!r}")
                if check(v):
                    raise ValueError(f"grid {name}: {v!r} out of range {interval}")
        for i, v in enumerate(self.policies):
            if not isinstance(v, str):
                raise ValueError(f"grid policies: unknown policy {v!r}; expected {', '.join(POLICIES)}")
            try:    # a variant (`h2o:recent_ratio=0.2`) as its stored label, the policy string of the simulator
                self.policies[i] = policy_label(v)
            except ValueError as exc:
                raise ValueError(f"grid policies: {exc}") from None
        for name in ("hw", "models", "policies", "kv_dtypes", "weight_dtypes", "profiles"):
            bad = [v for v in getattr(self, name) if not isinstance(v, (str, os.PathLike))]
            if bad:
                raise ValueError(f"grid {name}: expected names, got {bad[0]!r}")
        self.hw = [str(v) for v in self.hw]
        self.models = [str(v) for v in self.models]
        self.kv_dtypes = [canonical_dtype(v) for v in self.kv_dtypes]
        self.weight_dtypes = [canonical_dtype(v) for v in self.weight_dtypes]


INPUT_COLUMNS = ["hw", "model", "policy", "cache_ratio", "recent_ratio", "batch", "beams", "prompt", "gen",
                 "kv_dtype", "weight_dtype", "profile"]
GROUP_COLUMNS = ["hw", "model", "policy", "profile"]   # the engine vectorises over everything else


def build_grid(config: GridConfig) -> pd.DataFrame:
    """Cartesian product of the axes; validates every device, model and profile name first.

    `hw_hash` and `model_hash` identify the device file and model spec content (result caching)."""
    from hwmodels import load_device
    from sim.profiles import AUTO, default_profile_name, get_profile
    devices = {name: load_device(name) for name in config.hw}
    specs = {name: load_model(name) for name in config.models}
    for name in config.profiles:
        if name != AUTO:
            get_profile(name)
    axes = [config.hw, config.models, config.policies, config.cache_ratios, config.recent_ratios, config.batches,
            config.beams, config.prompts, config.gens, config.kv_dtypes, config.weight_dtypes, config.profiles]
    # MultiIndex.from_product builds the product in numpy (about 1 s per 2 million points); a Python
    # itertools.product of tuples would take ten times longer and memory for 10^7-point grids.
    df = pd.MultiIndex.from_product(axes, names=INPUT_COLUMNS).to_frame(index=False)
    if AUTO in config.profiles:   # every table names the profile it ran: `auto` becomes the device's default
        auto = df["profile"] == AUTO
        df.loc[auto, "profile"] = df.loc[auto, "hw"].map({n: default_profile_name(d) for n, d in devices.items()})
        df = df.drop_duplicates(subset=INPUT_COLUMNS, ignore_index=True)
    own = {p: get_policy(p).param("recent_ratio") for p in config.policies}
    own = {p: float(r) for p, r in own.items() if r is not None}
    if own:     # a variant's own recent_ratio is its points' recent ratio (sim.policies.variants), not the axis's
        mine = df["policy"].isin(list(own))
        df.loc[mine, "recent_ratio"] = df.loc[mine, "policy"].map(own)
        df = df.drop_duplicates(subset=INPUT_COLUMNS, ignore_index=True)
    # cells keep the user's spelling (a name or a file path), so evaluate() can load them anywhere
    df["hw_hash"] = df["hw"].map({n: d.content_hash for n, d in devices.items()})
    df["model_hash"] = df["model"].map({n: s.content_hash for n, s in specs.items()})
    return df
