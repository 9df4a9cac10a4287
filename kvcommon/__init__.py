"""The bottom layer of kvsim: plumbing every package shares, importing nothing from the project (and no torch).

- `kvcommon.cli`: the CLI kit (one-line `error: ...` + exit 2, `run(main)`, list flags, atomic writes);
- `kvcommon.fields`: `param()` field metadata (help, check, choices, flag, list-valued) and the generator of
  argparse flags from a dataclass's fields, so each parameter is declared once;
- `kvcommon.design`: `DesignPoint`, the simulator's design point with one default and one check per field;
- `kvcommon.variants`: the one grammar of a policy variant, `name:key=value[,key=value]`;
- `kvcommon.dtypes`: the data-type names (hwmodels.dtypes re-exports them);
- `kvcommon.styles`: the plotting style (colour, marker, line, label) of each policy.
"""
from kvcommon.design import DesignPoint
from kvcommon.fields import FieldError, param
from kvcommon.variants import PolicyVariant

__all__ = ["DesignPoint", "FieldError", "PolicyVariant", "param"]
