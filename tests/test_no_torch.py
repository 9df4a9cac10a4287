"""The simulator side must run where torch is not installed: importing it must not load torch."""
import subprocess
import sys

import pytest

MODULES = ["kvcommon", "sim", "hwmodels", "traces"]


@pytest.mark.parametrize("module", MODULES)
def test_simulator_side_does_not_import_torch(module):
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module({module!r})\n"
        "skip = {'traces.capture', 'traces.quality', 'traces.timing', 'hwmodels.calibrate'}\n"
        "for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "    if any(m.name == s or m.name.startswith(s + '.') for s in skip) or m.name.endswith('__main__'):\n"
        "        continue\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'transformers'))\n"
        "assert not bad, bad[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
