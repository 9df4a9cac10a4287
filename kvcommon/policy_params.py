"""The parameters each policy class declares, read from the classes' source without importing it.

keyformer/'s policies are dataclasses (one per file, `name: ClassVar[str] = "h2o"`, parameters as fields
with defaults, value checks `if self.noise not in NOISES` in `__post_init__`). They import torch, which
the simulator must not: `read_policy_parameters(folder)` parses the files instead (ast), so a parameter a
policy class gains is a valid variant key in every CLI without a second list to keep:

    read_policy_parameters(keyformer_folder)["keyformer"]["noise"]
    # VariantParam(name="noise", default="gumbel", kind="str", choices=("gumbel", "gaussian", "constant", "none"))

What it understands: fields annotated with a literal default (inherited from the bases found in the folder,
a subclass's default winning), the kind from the annotation, and choices from `self.<field> not in NAME` or
`not in ("a", "b")` in `__post_init__` (NAME a module-level tuple of strings in any file of the folder).
Range checks stay with the class (the torch side builds the policy and reports them).
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

from kvcommon.variants import VariantParam

KINDS = ("bool", "int", "float", "str")


def _kind(annotation: ast.expr) -> str:
    text = ast.unparse(annotation)
    return next((k for k in KINDS if k in text.replace("|", " ").split()), "str")


def _string_tuples(tree: ast.Module) -> dict[str, tuple]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError):
                continue
            if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
                found[node.targets[0].id] = value
    return found


def _choices(cls: ast.ClassDef, constants: dict[str, tuple]) -> dict[str, tuple]:
    """field -> allowed values, from `if self.<field> not in ...` in the class's __post_init__."""
    out = {}
    for method in cls.body:
        if not (isinstance(method, ast.FunctionDef) and method.name == "__post_init__"):
            continue
        for node in ast.walk(method):
            if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.NotIn)):
                continue
            left, right = node.left, node.comparators[0]
            if not (isinstance(left, ast.Attribute) and isinstance(left.value, ast.Name) and left.value.id == "self"):
                continue
            if isinstance(right, ast.Name) and right.id in constants:
                out[left.attr] = constants[right.id]
            elif isinstance(right, (ast.Tuple, ast.List)):
                try:
                    out[left.attr] = tuple(ast.literal_eval(right))
                except ValueError:
                    pass
    return out


def _own(cls: ast.ClassDef, constants: dict[str, tuple]) -> tuple[str | None, dict[str, VariantParam]]:
    """(the class's `name` ClassVar or None, its own fields)."""
    name, fields = None, {}
    choices = _choices(cls, constants)
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        key = node.target.id
        if "ClassVar" in ast.unparse(node.annotation):
            if key == "name" and node.value is not None:
                name = ast.literal_eval(node.value)
            continue
        if key.startswith("_") or node.value is None:
            continue
        try:
            default = ast.literal_eval(node.value)
        except ValueError:
            continue    # a computed default (field(default_factory=...)): not a variant parameter
        fields[key] = VariantParam(key, default, _kind(node.annotation), choices.get(key))
    return name, fields


@lru_cache(maxsize=None)
def read_policy_parameters(folder) -> dict[str, dict[str, VariantParam]]:
    """policy name -> parameter name -> VariantParam, for every dataclass with a `name` in `folder`'s files."""
    trees = [ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in sorted(Path(folder).glob("*.py"))]
    constants = {k: v for tree in trees for k, v in _string_tuples(tree).items()}
    classes = {node.name: node for tree in trees for node in tree.body if isinstance(node, ast.ClassDef)}
    merged: dict[str, tuple] = {}

    def resolve(class_name: str) -> tuple[str | None, dict]:
        if class_name not in merged:
            node = classes[class_name]
            fields: dict[str, VariantParam] = {}
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in classes:
                    fields.update(resolve(base.id)[1])
            name, own = _own(node, constants)
            for key, param in own.items():   # a subclass's default wins; its base's choices still apply
                inherited = fields.get(key)
                fields[key] = param if param.choices or inherited is None else \
                    VariantParam(key, param.default, param.kind, inherited.choices)
            merged[class_name] = (name, fields)
        return merged[class_name]

    out = {}
    for class_name in classes:
        name, fields = resolve(class_name)
        if isinstance(name, str) and fields:
            out[name] = fields
    return out
