"""kvcommon.policy_params: a policy's variant keys read from its dataclass's source (no import, no torch), so
a parameter a class gains is a key in every CLI (issue 27: no copied list)."""
from __future__ import annotations

import textwrap

from kvcommon.policy_params import read_policy_parameters
from kvcommon.variants import VariantParam

BASE = '''
from dataclasses import dataclass
from typing import ClassVar

import torch    # never imported: the file is only parsed

MODES = ("real", "padded")


@dataclass
class Policy:
    cache_ratio: float = 0.5
    budget_base: str = "real"
    pad_length: int = 1920
    name: ClassVar[str] = "base"

    def __post_init__(self):
        if self.budget_base not in MODES:
            raise ValueError("bad")
'''
CHILD = '''
from dataclasses import dataclass, field
from typing import ClassVar

from pkg.base import Policy, MODES

NOISES = ("gumbel", "none")


@dataclass
class NoisyPolicy(Policy):
    noise: str = "gumbel"
    tau: float = 1.0
    steps: int | None = None
    pad_length: int = 64        # a subclass's own default
    flag: bool = False
    _private: int = 0
    computed: list = field(default_factory=list)
    name: ClassVar[str] = "noisy"
    needs_scores: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        if self.noise not in NOISES:
            raise ValueError("bad")
        if self.mode_of_reduce not in ("sum", "mean"):
            raise ValueError("bad")
'''


def test_fields_defaults_kinds_and_choices_from_source(tmp_path):
    (tmp_path / "base.py").write_text(textwrap.dedent(BASE))
    (tmp_path / "noisy.py").write_text(textwrap.dedent(CHILD))
    found = read_policy_parameters(tmp_path)
    assert set(found) == {"base", "noisy"}
    noisy = found["noisy"]
    assert set(noisy) == {"cache_ratio", "budget_base", "pad_length", "noise", "tau", "steps", "flag"}
    assert noisy["noise"] == VariantParam("noise", "gumbel", "str", ("gumbel", "none"))
    assert noisy["budget_base"].choices == ("real", "padded")            # the base's check still applies
    assert noisy["pad_length"] == VariantParam("pad_length", 64, "int")  # the subclass's default wins
    assert (noisy["tau"].kind, noisy["steps"].kind, noisy["flag"].kind) == ("float", "int", "bool")


def test_a_new_field_is_a_new_key(tmp_path):
    (tmp_path / "base.py").write_text(textwrap.dedent(BASE))
    (tmp_path / "noisy.py").write_text(textwrap.dedent(CHILD).replace('    flag: bool = False\n',
                                                                       '    flag: bool = False\n    beta: float = 20.0\n'))
    assert read_policy_parameters(tmp_path)["noisy"]["beta"] == VariantParam("beta", 20.0, "float")
