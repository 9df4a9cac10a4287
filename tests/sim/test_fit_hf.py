"""sim.fit_hf: the hf-fit profile's two CPU terms fitted to the bundled plain transformers decode steps,
checked leave-one-shape-out, and the shipped fit file agreeing with the engine as it is."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml

from sim import bounded_fit as bf
from sim import fit_hf
from sim.profiles import hf_fit
from sim.validation import hf_fit_report
from sim.validation.measured import DATA_DIR
from tests.helpers import assert_one_line_error

FOLDERS = DATA_DIR / "cpu-hf-sdpa"
needs_folders = pytest.mark.skipif(not FOLDERS.is_dir(), reason="traces/data/cpu-hf-sdpa not bundled")


@needs_folders
def test_folds_never_see_their_shape_and_the_file_round_trips(tmp_path):
    result = fit_hf.run_fit([str(FOLDERS)])
    shapes = {p["shape"] for p in result["points"]}
    assert shapes == set(result["folds"]) and len(shapes) == 3
    for shape, fold in result["folds"].items():           # a fold is the fit of the other shapes' points only
        train = [p for p in result["points"] if p["shape"] != shape]
        assert fit_hf.fit_terms(train, result["hw"], result["device_hash"]) == pytest.approx(fold)
        for t in hf_fit.TERMS:
            assert t.lo <= fold[t.name] <= t.hi
    measured = result["measured"]
    assert bf.mape(result["in_sample"], measured) <= bf.mape(result["unfitted"], measured)
    out = tmp_path / "fit.yaml"
    assert fit_hf.main(["--measured", str(FOLDERS), "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["device"]["content_hash"] == result["device_hash"]
    assert len(doc["predictions"]) == len(result["points"]) and set(doc["loso_folds"]) == shapes


@needs_folders
def test_shipped_fit_file_is_current_and_its_section_reports_loso():
    data = hf_fit.read_fit_file()
    lines, summary = hf_fit_report.build_section()
    assert "skipped" not in summary, lines
    assert not any(line.startswith("WARNING") for line in lines)      # the engine has not moved since the fit
    assert summary["overall"]["points"] == data["fit"]["points"]
    assert summary["overall"]["loso"] == pytest.approx(data["fit"]["loso_mape_pct"], abs=0.05)
    assert summary["status"] in ("PASS", "FAIL")


def test_user_mistakes_are_one_line_errors(tmp_path, capsys):
    assert fit_hf.main(["--measured", str(tmp_path / "nowhere")]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "no such folder")
    assert fit_hf.main(["--out", str(tmp_path)]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "is a folder")
    if FOLDERS.is_dir():                                              # one shape cannot be left out
        one = tmp_path / "one"
        shutil.copytree(FOLDERS / "llama-gqa-rand", one / "llama-gqa-rand")
        shutil.copy(FOLDERS / "cpu-local-1t-hf-sdpa.yaml", one / "cpu-local-1t-hf-sdpa.yaml")
        assert fit_hf.main(["--measured", str(one), "--out", str(tmp_path / "x.yaml")]) == 2
        assert_one_line_error(2, capsys.readouterr().err, "at least two model shapes")
        assert not (tmp_path / "x.yaml").exists()
