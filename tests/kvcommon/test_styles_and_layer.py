"""kvcommon.styles, and kvcommon's place at the bottom: it imports nothing from the project, nor torch."""
import subprocess
import sys

from kvcommon.styles import OTHER, POLICY_STYLES, style


def test_every_policy_has_a_distinct_style():
    import keyformer
    assert set(keyformer.POLICIES) <= set(POLICY_STYLES)
    assert len({s.color for s in POLICY_STYLES.values()}) == len(POLICY_STYLES)


def test_variants_share_their_policy_style_and_unknown_ones_are_other():
    assert style("keyformer(noise=gaussian)") == POLICY_STYLES["keyformer"] == style("keyformer:0.5")
    assert style("mine").color == OTHER.color and style("mine").label == "mine"
    assert style("h2o").line() == {"color": "tab:blue", "marker": "o", "ls": (0, (4, 2))}


def test_kvcommon_imports_nothing_of_the_project():
    code = ("import importlib, pkgutil, sys, kvcommon\n"
            "for m in pkgutil.walk_packages(kvcommon.__path__, 'kvcommon.'):\n"
            "    importlib.import_module(m.name)\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in\n"
            "             ('torch', 'transformers', 'sim', 'traces', 'hwmodels', 'keyformer', 'numpy', 'pandas'))\n"
            "assert not bad, bad[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True)
