"""The one grammar of a policy variant: `name` or `name:key=value[,key=value]`.

    PolicyVariant.parse("keyformer:noise=gaussian,tau=2")   # PolicyVariant("keyformer", {"noise": "gaussian", "tau": 2})
    str(variant)                                            # "keyformer:noise=gaussian,tau=2" (keys sorted)
    variant.label                                           # "keyformer(noise=gaussian,tau=2)": the stored form

Values read as int, then float, then true/false, else text. Two older spellings go through the same parser
where a documented interface still takes them: `name:VALUE` (a bare value for one named parameter, e.g.
traces.timing's `--policy keyformer:0.5` for the cache ratio: `parse(text, positional="cache_ratio")`) and the
stored label `name(key=value)` that trace folders, timing folders and sweep tables keep (`from_label`).
`PolicyVariant.read` takes either spelling (what every CLI's --policy accepts), `split_variants` a
comma-separated list of them, and `check_variant` holds a variant against the parameters its policy declares
(`VariantParam`: kvcommon.policy_params reads them from the policy classes).
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

    @classmethod
    def read(cls, text: str) -> PolicyVariant:
        """Either spelling a user may type: `name:key=value,...` or the stored label `name(key=value,...)`."""
        return cls.from_label(text) if "(" in str(text) else cls.parse(text)

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


@dataclass(frozen=True)
class VariantParam:
    """One parameter a policy variant may set: its default, its kind (bool, int, float, str) and, where the
    policy names them, the values it accepts."""
    name: str
    default: object = None
    kind: str = "str"
    choices: tuple | None = None

    def problem(self, value) -> str | None:
        """What is wrong with `value` for this parameter (None: nothing)."""
        if self.choices is not None:
            return None if value in self.choices else f"must be one of {', '.join(map(str, self.choices))}"
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.kind == "bool" and not isinstance(value, bool):
            return "must be true or false"
        if self.kind == "int" and not (number and float(value).is_integer()):
            return "must be an integer"
        if self.kind == "float" and not number:
            return "must be a number"
        return None


def check_variant(variant: PolicyVariant, parameters: dict, reserved: dict | None = None) -> PolicyVariant:
    """`variant` if its parameters are among `parameters` (name -> VariantParam) with valid values; else a
    ValueError of one line listing the valid keys (or values). `reserved`: keys with their own flag (key ->
    why, e.g. cache_ratio -> "give it with --cache-ratio")."""
    for key, value in variant.params.items():
        if reserved and key in reserved:
            raise ValueError(f"policy {variant.name}: {key} is not a variant parameter ({reserved[key]})")
        param = parameters.get(key)
        if param is None:
            valid = ", ".join(sorted(k for k in parameters if not (reserved and k in reserved))) or "none"
            raise ValueError(f"policy {variant.name} has no parameter {key!r}; its parameters: {valid}")
        problem = param.problem(value)
        if problem:
            raise ValueError(f"policy {variant.name}: {key} {problem}, got {value!r}")
    return variant


def split_variants(values) -> list[str]:
    """Comma-separated variants (one string or several) into one string per variant: a comma inside
    `name:k=v,k=v` or `name(k=v,k=v)` belongs to that variant's parameters (a piece holding `=` but no
    policy name continues the previous variant)."""
    out: list[str] = []
    for value in [values] if isinstance(values, str) else values:
        for piece in str(value).split(","):
            if not piece.strip():
                continue
            if out and "=" in piece and ":" not in piece and "(" not in piece:
                out[-1] = f"{out[-1]},{piece.strip()}"
            else:
                out.append(piece.strip())
    return out


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
