"""The `kvsim` console script (issue 17): each subcommand is its `python -m` module, unchanged."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim import kvsim

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def test_pyproject_declares_the_console_script():
    tomllib = pytest.importorskip("tomllib")     # Python >= 3.11
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"kvsim": "sim.kvsim:main"}


def test_every_subcommand_names_an_importable_module():
    import importlib.util
    for name, (module, _text) in kvsim.COMMANDS.items():
        assert importlib.util.find_spec(module) is not None, (name, module)
    assert {"predict", "sweep", "serve", "validate", "calibrate", "generate", "capture", "quality"} <= set(kvsim.COMMANDS)


def test_predict_through_kvsim_equals_python_m(capsys):
    args = ["--hw", "h100-sxm", "--model", "llama-3-8b", "--prompt", "1024", "--gen", "64", "--json"]
    assert kvsim.main(["predict", *args]) == 0
    via_kvsim = json.loads(capsys.readouterr().out)
    direct = subprocess.run([PY, "-m", "sim.predict", *args], capture_output=True, text=True, check=True)
    assert via_kvsim == json.loads(direct.stdout)


def test_errors_and_help(capsys):
    assert kvsim.main(["predict", "--hw", "h100-sxm", "--model", "gpt2", "--prompt", "4096", "--gen", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert kvsim.main(["bogus"]) == 2 and "unknown subcommand 'bogus'" in capsys.readouterr().err
    assert kvsim.main([]) == 2 and "subcommands:" in capsys.readouterr().err
    assert kvsim.main(["--help"]) == 0 and "calibrate" in capsys.readouterr().out
    assert kvsim.main(["hw", "list", "--names"]) == 0 and "h200-sxm" in capsys.readouterr().out.split()


def test_kvsim_predict_imports_no_torch():
    code = ("import sys; from sim import kvsim; "
            "rc = kvsim.main(['predict', '--hw', 'l4', '--model', 'gpt2', '--prompt', '128', '--gen', '8']); "
            "assert rc == 0, rc; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not (Path(PY).parent / "kvsim").exists(), reason="console script not installed in this venv "
                    "(pip install -e . creates it)")
def test_installed_script_runs():
    proc = subprocess.run([str(Path(PY).parent / "kvsim"), "hw", "list", "--names"], capture_output=True, text=True)
    assert proc.returncode == 0 and "h100-sxm" in proc.stdout.split()
