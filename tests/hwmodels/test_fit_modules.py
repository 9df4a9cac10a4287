"""hwmodels.calibrate's fit modules import one way: fit -> fit_attention -> fit_tables (no circle)."""
import ast
from pathlib import Path

CALIBRATE = Path(__file__).resolve().parents[2] / "hwmodels" / "calibrate"


def _relative_imports(name: str) -> set[str]:
    tree = ast.parse((CALIBRATE / f"{name}.py").read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}


def test_no_import_circle_between_fit_and_fit_attention():
    assert "fit" not in _relative_imports("fit_attention")
    assert _relative_imports("fit_tables") <= set()          # only ..curves (level 2)
    assert "fit_attention" in _relative_imports("fit")
