"""The one plotting style of each policy (colour, marker, line style, legend label), for every figure:
traces/plots.py, sim/plots.py, sim/tradeoff.py and the notebooks. Plain matplotlib names (no import)."""
from __future__ import annotations

from dataclasses import dataclass

from kvcommon.variants import base_name


@dataclass(frozen=True)
class PolicyStyle:
    color: str
    marker: str
    linestyle: object   # a matplotlib line style: "-" or a dash tuple
    label: str

    def line(self) -> dict:
        """Keyword arguments for `ax.plot` (colour, marker, line style)."""
        return {"color": self.color, "marker": self.marker, "ls": self.linestyle}


POLICY_STYLES: dict[str, PolicyStyle] = {
    "full": PolicyStyle("black", "s", "-", "full"),
    "window": PolicyStyle("tab:gray", "v", (0, (6, 3)), "window"),
    "streaming": PolicyStyle("tab:green", "^", (0, (1, 2)), "streaming"),
    "h2o": PolicyStyle("tab:blue", "o", (0, (4, 2)), "h2o"),
    "keyformer": PolicyStyle("tab:red", "D", "-", "keyformer"),
    "snapkv": PolicyStyle("tab:brown", "P", (0, (3, 1, 1, 1)), "snapkv"),
    "tova": PolicyStyle("tab:olive", "X", (0, (5, 1)), "tova"),
    "mass": PolicyStyle("tab:cyan", "h", (0, (2, 2)), "mass"),
    "pyramidkv": PolicyStyle("tab:pink", "p", (0, (8, 2, 2, 2)), "pyramidkv"),
    "adakv": PolicyStyle("tab:orange", "*", (0, (1, 1)), "adakv"),
}
# Anything else (a plug-in policy): still drawn, visibly not one of the above.
OTHER = PolicyStyle("tab:purple", "x", ":", "")


def style(policy: str) -> PolicyStyle:
    """The style of a policy or of one of its variants (`keyformer(noise=gaussian)` is keyformer's colour);
    unknown policies get OTHER, labelled with their own name."""
    known = POLICY_STYLES.get(base_name(policy))
    if known is not None:
        return known
    return PolicyStyle(OTHER.color, OTHER.marker, OTHER.linestyle, str(policy))
