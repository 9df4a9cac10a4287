"""The one grammar of a policy variant: `name` or `name:key=value[,key=value]`.

    PolicyVariant.parse("keyformer:noise=gaussian,tau=2")   # PolicyVariant("keyformer", {"noise": "gaussian", "tau": 2})
    str(variant)                                            # "keyformer:noise=gaussian,tau=2" (keys sorted)
    variant.label                                           # "keyformer(noise=gaussian,tau=2)": the stored form

Values read as int, then float, then true/false, else text. Two older spellings go through the same parser
where a documented interface still takes them: `name:VALUE` (a bare value for one named parameter, e.g.
traces.timing's `--policy keyformer:0.5` for the cache ratio: `parse(text, positional="cache_ratio")`) and the
stored label `name(key=value)` that trace folders, timing folders and sweep tables keep (`from_label`).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PolicyVariant:
    name: str
    params: dict = field(default_factory=dict)

    def __hash__(self):
        return hash((self.name, tuple(sorted(self.params.items()))))

    @classmethod
    def parse(cls, text: str, positional: str | None = None) -> PolicyVariant:
        """`name` or `name:key=value,...`; with `positional`, `name:VALUE` sets that parameter."""
        name, _, rest = str(text).strip().partition(":")
        name = name.strip()
        if not name:
            raise ValueError(f"empty policy name in {text!r}")
        params = {}
        items = [p.strip() for p in rest.split(",")]
        for i, item in enumerate(filter(None, items)):
            key, eq, value = item.partition("=")
            if not eq and positional is not None and i == 0:
                key, value = positional, item
            elif not eq or not key.strip():
                raise ValueError(f"bad policy parameter {item!r} in {text!r} (expected key=value)")
            key = key.strip()
            if key in params:
                raise ValueError(f"policy parameter {key!r} given twice in {text!r}")
            params[key] = parse_value(value.strip())
        return cls(name, params)

    @classmethod
    def from_label(cls, label: str) -> PolicyVariant:
        """The stored label `name(key=value,...)` (or a bare `name`) back into a variant."""
        text = str(label).strip()
        name, paren, rest = text.partition("(")
        if not paren:
            return cls.parse(name)
        if not rest.endswith(")"):
            raise ValueError(f"bad policy label {label!r}: expected name(key=value,...)")
        return cls.parse(f"{name}:{rest[:-1]}")

    def __str__(self) -> str:
        return format_variant(self.name, self.params)

    @property
    def label(self) -> str:
        """The string a variant is stored under: `keyformer` or `keyformer(noise=gaussian)` (keys sorted)."""
        if not self.params:
            return self.name
        return f"{self.name}({_items(self.params)})"

    def get(self, key: str, default=None):
        return self.params.get(key, default)

    def without(self, *keys: str) -> PolicyVariant:
        """The variant less some parameters (e.g. the cache ratio, which is a column, not part of a label)."""
        return PolicyVariant(self.name, {k: v for k, v in self.params.items() if k not in keys})


def format_variant(name: str, params: dict | None = None) -> str:
    """`name:key=value,...` (keys sorted), the inverse of `PolicyVariant.parse`."""
    return f"{name}:{_items(params)}" if params else name


def base_name(text: str) -> str:
    """The policy name of a variant in either spelling: `keyformer(noise=gaussian)`, `h2o:0.2` -> the name."""
    return str(text).split("(", 1)[0].split(":", 1)[0].strip()


def _items(params: dict) -> str:
    # str(value), as the labels already stored in trace folders were written (True reads back as true)
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def parse_value(value: str):
    """A parameter's text as int, float, bool (true/false) or the text itself."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)
