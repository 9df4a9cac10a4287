"""Policy variants as given on the command line (torch-free): the project's one grammar,
`name` or `name:key=value,key=value` (kvcommon.variants); `.label` is the stored `name(key=value)` form."""
from __future__ import annotations

from kvcommon.variants import PolicyVariant

# traces.capture's name for it (CaptureConfig.policies holds strings or these)
PolicySpec = PolicyVariant

__all__ = ["PolicySpec"]
