"""Parameters declared once: a dataclass field carries its help, its range check, its choices and its flag
name (`param(...)`), and both the library check and the CLI flags are generated from it (vidur's configs
idea, kept flat).

    @dataclass(frozen=True)
    class Point:
        cache_ratio: float = param(1.0, help="KV budget as a fraction of the prompt", check=in_range(0, 1, low_open=True))
        def __post_init__(self):
            validate(self)                      # FieldError("cache_ratio must be in (0, 1], got 1.5")

    add_flags(parser, Point, ["cache_ratio"])   # --cache-ratio, float, default 1.0, help from the field
    point = from_args(Point, parser.parse_args())   # ValueError("--cache-ratio must be in (0, 1], got 1.5")

Library errors name fields; only the CLI layer (`from_args`, `flag_of`) knows flags.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Callable, Iterable

from kvcommon.cli import checked_int


# metadata keys of param(); everything else in a field's metadata is left alone
_KEY = "kvcommon"


class FieldError(ValueError):
    """A field's value out of its range: names the field (`cache_ratio must be in (0, 1], got 1.5`)."""

    def __init__(self, field: str, problem: str, value):
        self.field, self.problem, self.value = field, problem, value
        super().__init__(f"{field} {problem}, got {_show(value)}")

    def for_flag(self, flag: str) -> ValueError:
        """The same problem worded for the command line (`--cache-ratio must be in (0, 1], got 1.5`)."""
        return ValueError(f"{flag} {self.problem}, got {_show(self.value)}")


def _show(value) -> str:
    return repr(value) if isinstance(value, str) else str(value)


# --- checks: value -> problem phrase, or None when the value is fine ------------------------------------------

def in_range(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Callable:
    """`must be in (0, 1]` style interval check."""
    text = f"must be in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def check(value):
        ok = (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
        return None if ok else text
    return check


def at_least(low) -> Callable:
    """`must be >= 1`."""
    return lambda value: None if value >= low else f"must be >= {low}"


def above(low) -> Callable:
    """`must be > 0`."""
    return lambda value: None if value > low else f"must be > {low}"


def one_of(names: Iterable[str]) -> Callable:
    names = tuple(names)
    return lambda value: None if value in names else f"must be one of {', '.join(names)}"


# --- declaring a field ---------------------------------------------------------------------------------------

def param(default=dataclasses.MISSING, *, help: str = "", check: Callable | None = None,
          choices: Iterable | None = None, flag: str | None = None, list: bool = False,
          convert: Callable | None = None, metavar: str | None = None, default_factory=dataclasses.MISSING):
    """A dataclass field with the metadata the checks and the flags are generated from.

    check: value -> problem phrase or None (applied to each item of a list-valued field);
    choices: the allowed values (checked, and argparse's choices); flag: the option name when it is not
    `--field-name`; list: the flag takes comma-separated values (the field holds a tuple); convert: the
    text -> value parser of the flag (default: the field's type, int/float/str) that may also normalise a
    value given to the dataclass directly (e.g. a dtype alias -> its canonical name)."""
    meta = {"help": help, "check": check, "choices": tuple(choices) if choices is not None else None,
            "flag": flag, "list": list, "convert": convert, "metavar": metavar}
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_KEY: meta})


def same_as(cls, name: str):
    """A field with the default, check and help of `cls`'s field `name` (declared with param()): a
    dataclass that repeats another's parameter keeps its one declaration."""
    f = declared(cls)[name]
    return dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=f.metadata)


def _meta(f: dataclasses.Field) -> dict:
    return f.metadata.get(_KEY, {})


def declared(cls) -> dict[str, dataclasses.Field]:
    """The fields of `cls` declared with param(), by name."""
    return {f.name: f for f in dataclasses.fields(cls) if _KEY in f.metadata}


def flag_of(cls, name: str) -> str:
    """The command-line flag of field `name` of `cls`."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return _meta(f).get("flag") or "--" + name.replace("_", "-")


def help_of(cls, name: str) -> str:
    """The help text declared on field `name` of `cls` (for a flag a CLI writes by hand)."""
    return _meta({f.name: f for f in dataclasses.fields(cls)}[name]).get("help", "")


def validate(obj) -> None:
    """Check (and, through `convert`, normalise) every param() field of a (frozen) dataclass instance;
    raises FieldError naming the first bad field. Call it from `__post_init__`."""
    for name, f in declared(type(obj)).items():
        meta = _meta(f)
        value = getattr(obj, name)
        if value is None:       # None: "not given" (the caller's default applies); nothing to check
            continue
        items = tuple(value) if meta["list"] else (value,)
        if meta["convert"] is not None:
            try:
                converted = tuple(meta["convert"](item) for item in items)
            except (TypeError, ValueError) as exc:
                raise FieldError(name, _problem(exc, meta), value) from None
            object.__setattr__(obj, name, converted if meta["list"] else converted[0])   # lists become tuples
            items = converted
        for item in items:
            problem = None
            if meta["choices"] is not None and item not in meta["choices"]:
                problem = f"must be one of {', '.join(map(str, meta['choices']))}"
            elif meta["check"] is not None:
                problem = meta["check"](item)
            if problem:
                raise FieldError(name, problem, item)


def _problem(exc: Exception, meta: dict) -> str:
    if meta["choices"] is not None:
        return f"must be one of {', '.join(map(str, meta['choices']))}"
    return f"is not valid: {exc}"


# --- the CLI side --------------------------------------------------------------------------------------------

def _text_parser(f: dataclasses.Field, meta: dict) -> Callable:
    """The text -> value parser of a flag: the field's `convert`, else its (item) type: int, float or str
    (bool: the flag is a switch)."""
    if meta["convert"] is not None:
        return meta["convert"]
    kind = f.type if isinstance(f.type, str) else str(f.type)     # "tuple[int, ...]", "<class 'float'>"
    for name, cast in (("bool", bool), ("int", checked_int), ("float", float)):
        if re.search(rf"\b{name}\b", kind):
            return cast
    return str


def _typed(parse: Callable, flag: str) -> Callable:
    """argparse type: one-line `--flag: expected an integer, got 'x'`-style messages."""
    what = {int: "an integer", checked_int: "an integer", float: "a number"}.get(parse, "a valid value")

    def convert(text: str):
        try:
            return parse(text)
        except (TypeError, ValueError) as exc:
            if "2^53" in str(exc):
                raise argparse.ArgumentTypeError(f"expected an integer of at most 2^53, got {text!r}") from None
            detail = f": {exc}" if parse not in (int, float, checked_int) and str(exc) else ""
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}{detail}") from None
    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _typed_list(parse: Callable) -> Callable:
    """argparse type for comma-separated values: `--batch 1,8,32` -> [1, 8, 32]."""
    what = {int: "integers", checked_int: "integers", float: "numbers"}.get(parse, "values")

    def convert(text: str):
        detail = ""
        try:
            values = [parse(t.strip()) for t in text.split(",") if t.strip()]
        except (TypeError, ValueError) as exc:
            values, detail = None, " (integers of at most 2^53)" if "2^53" in str(exc) else ""
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}{detail}")
        return values
    convert.__name__ = f"list of {what}"
    return convert


def add_flags(parser, cls, names: Iterable[str], *, defaults: dict | None = None, required: Iterable[str] = (),
              help: dict | None = None, choices: dict | None = None) -> None:
    """Add one flag per field of `cls` in `names` (in that order), from the fields' metadata.

    defaults / help / choices: per-field overrides where one CLI differs (its documented default, a
    sharper help line, the choices only the caller knows); required: fields the CLI must be given.
    The flag's dest is the field name, so `from_args(cls, args)` finds it."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults, help, choices, required = defaults or {}, help or {}, choices or {}, set(required)
    for name in names:
        f = fields[name]
        meta = _meta(f)
        flag = flag_of(cls, name)
        parse = _text_parser(f, meta)
        kwargs = {"dest": name, "help": help.get(name, meta.get("help") or None)}
        if parse is bool:           # a switch: off unless given
            kwargs.update(action="store_true", default=defaults.get(name, f.default))
            parser.add_argument(flag, **kwargs)
            continue
        if meta.get("list"):
            kwargs["type"] = _typed_list(parse)
        else:
            kwargs["type"] = _typed(parse, flag)
        allowed = choices.get(name, meta.get("choices"))
        if allowed is not None and not meta.get("list"):
            kwargs["choices"] = tuple(allowed)
        if meta.get("metavar"):
            kwargs["metavar"] = meta["metavar"]
        elif flag != "--" + name.replace("_", "-") and "choices" not in kwargs:   # name the flag, not the field
            kwargs["metavar"] = flag.lstrip("-").replace("-", "_").upper()
        if name in required:
            kwargs["required"] = True
        elif name in defaults:
            kwargs["default"] = defaults[name]
        elif f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        else:
            kwargs["required"] = True
        parser.add_argument(flag, **kwargs)


def from_args(cls, args: argparse.Namespace, **overrides):
    """Build `cls` from the parsed flags that name its fields (plus `overrides`); a field's FieldError
    comes back as a ValueError naming the flag (`--cache-ratio must be in (0, 1], got 1.5`)."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(overrides)
    for name in [n for n, v in values.items() if isinstance(v, list)]:
        values[name] = tuple(values[name])
    try:
        return cls(**values)
    except FieldError as exc:
        raise exc.for_flag(flag_of(cls, exc.field)) from None
