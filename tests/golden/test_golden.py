"""Behaviour is unchanged by restructuring: every output column of a fixed grid of predictions, DES runs
and validation points is byte-identical to tests/golden/data/ (written by `python -m tests.golden.regenerate`)."""
from __future__ import annotations

import difflib

import pytest

from tests.golden.cases import ROOT, cases, read_golden, run_case


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_golden(case, tmp_path, monkeypatch):
    if case.needs and not (ROOT / case.needs).exists():
        pytest.skip(f"{case.needs} absent (published data lives outside the repository)")
    monkeypatch.chdir(ROOT)
    expected = read_golden(case)
    got = run_case(case, tmp_path / "out")
    if got != expected:
        diff = "".join(list(difflib.unified_diff(expected.splitlines(True), got.splitlines(True), "golden", "now"))[:40])
        pytest.fail(f"{case.name} changed:\n{diff}")
