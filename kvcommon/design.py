"""`DesignPoint`: what the simulator predicts, one point of the design space, with one default and one
range check per parameter (declared once, in the field metadata the CLI flags are generated from).

Policy names are not checked here (kvcommon imports nothing; the policy list lives with the policies):
CLIs pass them as `choices` to `add_flags`, the library checks them where the policy is built."""
from __future__ import annotations

from dataclasses import dataclass

from kvcommon.dtypes import DTYPES, dtype_name
from kvcommon.fields import at_least, in_range, param, validate
from kvcommon.variants import PolicyVariant

# The defaults every CLI and library function shares (one place; `recent_ratio=0.3` was written in 12).
DEFAULT_POLICY = "full"
DEFAULT_CACHE_RATIO = 1.0
DEFAULT_RECENT_RATIO = 0.3
DEFAULT_DTYPE = "bf16"
# `auto`: the fitted engine profile of the device's class (GPU: trtllm, CPU: hf; sim.profiles.CLASS_DEFAULTS);
# `fused` (= `ideal`) is the ideal-kernel bound
DEFAULT_PROFILE = "auto"

CACHE_RATIO_RANGE = in_range(0, 1, low_open=True)   # (0, 1]: the budget keeps at least one token
RECENT_RATIO_RANGE = in_range(0, 1)                 # [0, 1]: share of the budget kept as a recent window
POSITIVE = at_least(1)
# An empty name (`--hw ""`, an unset shell variable) names nothing; said with the flag, not as ": unknown device".
NAMED = lambda value: None if str(value).strip() else "must not be empty"


@dataclass(frozen=True)
class DesignPoint:
    hw: str = param(help="device name (python -m hwmodels list) or hardware YAML file", check=NAMED)
    model: str = param(help="shipped model name or HF config.json / model folder", check=NAMED)
    prompt: int = param(help="prompt tokens per request", check=POSITIVE)
    gen: int = param(help="generated tokens per request", check=POSITIVE)
    batch: int = param(1, help="requests decoded together", check=POSITIVE)
    beams: int = param(1, help="beam width: multiplies KV and batch rows", check=POSITIVE)
    policy: str = param(DEFAULT_POLICY, help="KV-cache policy")
    # the variant's own parameters (`keyformer:noise=gaussian` -> (("noise", "gaussian"),)), sorted by key
    policy_params: tuple = ()
    cache_ratio: float = param(DEFAULT_CACHE_RATIO, help="KV budget as a fraction of the prompt, (0, 1]",
                               check=CACHE_RATIO_RANGE)
    recent_ratio: float = param(DEFAULT_RECENT_RATIO, help="recent window as a fraction of the budget, [0, 1]",
                                check=RECENT_RATIO_RANGE)
    kv_dtype: str = param(DEFAULT_DTYPE, help=f"KV-cache dtype, one of {', '.join(DTYPES)}",
                          choices=DTYPES, convert=dtype_name)
    weight_dtype: str = param(DEFAULT_DTYPE, help=f"weight dtype, one of {', '.join(DTYPES)}",
                              choices=DTYPES, convert=dtype_name)
    profile: str = param(DEFAULT_PROFILE, help="software-stack profile (auto: the fitted engine profile of the "
                         "device's class, GPU trtllm, CPU hf; fused or ideal: the ideal-kernel bound)")

    def __post_init__(self):
        params = self.policy_params
        if isinstance(params, dict):
            params = params.items()
        object.__setattr__(self, "policy_params", tuple(sorted(tuple(params))))
        validate(self)

    @property
    def variant(self) -> PolicyVariant:
        """The policy with its own parameters, e.g. `keyformer:noise=gaussian`."""
        return PolicyVariant(self.policy, dict(self.policy_params))
