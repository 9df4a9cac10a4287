"""Policy variants as given on the command line (torch-free)."""
from __future__ import annotations

from dataclasses import dataclass, field

from traces import schema


@dataclass(frozen=True)
class PolicySpec:
    """A policy variant as given on the command line: `name` or `name:key=value,key=value`."""
    name: str
    params: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return schema.policy_label(self.name, self.params)

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        name, _, rest = text.strip().partition(":")
        if not name:
            raise ValueError(f"empty policy name in {text!r}")
        params = {}
        for item in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ValueError(f"bad policy parameter {item!r} in {text!r} (expected key=value)")
            params[key.strip()] = _parse_value(value.strip())
        return cls(name, params)


def _parse_value(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)
