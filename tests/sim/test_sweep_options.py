"""sim.sweep --config: a wrong shape (a list where a number belongs, a list in a list) is one clear line
naming the key, never Python's own text (issue 17)."""
from __future__ import annotations

import pytest

from sim import sweep
from sim.cli import run


@pytest.mark.parametrize("text, message", [
    ("qps: [1, [2]]", "qps must be numbers > 0 (or inf), got [2]"),
    ("qps: fast", "qps must be numbers > 0 (or inf), got 'fast'"),
    ("qps: [1, 2]", "qps lists are a serving (des) axis: use --engine des"),
    ("recent_ratios: [[0.3]]", "grid recent_ratios: expected numbers in [0, 1], got [0.3]"),
    ("cache_ratios: [0.5, [1]]", "grid cache_ratios: expected numbers in (0, 1], got [1]"),
    ("cache_ratios: [0.5, 2]", "grid cache_ratios: 2 out of range (0, 1]"),
    ("hw: [[h100-sxm]]", "grid hw: expected names, got ['h100-sxm']"),
    ("models: [{a: 1}]", "grid models: expected names, got {'a': 1}"),
    ("policies: [[h2o]]", "grid policies: unknown policy ['h2o']"),
    ("requests: [10, 20]", "requests must be a positive integer, got [10, 20]"),
])
def test_config_shape_mistakes_are_one_clear_line(tmp_path, capsys, text, message):
    path = tmp_path / "grid.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError) as exc:
        sweep.load_config(path)
    assert str(exc.value).startswith(f"config {path}: {message}")
    for python_text in ("not supported between", "argument must be", "object is not"):
        assert python_text not in str(exc.value)
    rc = run(sweep.main, ["--config", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"error: config {path}: {message}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
