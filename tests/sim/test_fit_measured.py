"""`python -m sim.fit_profiles --measured-run FILE... --hw H`: a user's own benchmark runs fit their stack's host
terms and GEMM efficiency (the rest stays the shipped joint fit), into a profile file with provenance that
KVSIM_ENGINE_PROFILES points the engine at; mistakes are one-line errors writing nothing."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim import fit_measured, fit_profiles
from sim.profiles import engines as pe
from sim.validation.measured_run import load_measured_runs

DATA = Path(__file__).parent / "data" / "measured_runs"
VLLM = DATA / "vllm_serve.json"


def test_terms_a_run_fits_are_its_runtimes_host_terms_and_gemm():
    assert [t.name for t in fit_measured.terms_for("vllm-v1")] == ["vllm_v1_step_s", "vllm_v1_seq_s", "gemm_eff"]
    assert [t.name for t in fit_measured.terms_for("pytorch")] == ["gemm_eff"]


def test_fit_moves_towards_the_run_and_keeps_the_rest(tmp_path):
    runs = load_measured_runs(VLLM)
    result = fit_measured.fit_runs(runs, hw="h100-sxm")
    before = sum(abs(b / m - 1) for _, m, b, _ in result["items"])
    after = sum(abs(a / m - 1) for _, m, _, a in result["items"])
    assert after <= before + 1e-9
    shipped = pe.engine_values(pe.read_fit_file(), "vllm")
    for name, value in result["terms"].items():
        if name not in result["fitted"]:
            assert value == shipped[name]


def test_cli_writes_a_profile_the_engine_can_load(tmp_path, capsys, monkeypatch):
    out = tmp_path / "mine.yaml"
    assert fit_profiles.main(["--measured-run", str(VLLM), "--hw", "h100-sxm", "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["fit"]["measured_runs"] == ["vllm_serve.json"] and len(doc["fit"]["measured_runs_sha256"][0]) == 64
    assert doc["fit"]["fitted_terms"] == ["vllm_v1_step_s", "vllm_v1_seq_s", "gemm_eff"]
    assert "MAPE" in capsys.readouterr().out
    values = pe.engine_values(pe.read_fit_file(out), "vllm", out)
    assert set(values) == set(pe.TERM_NAMES)


def test_cli_mistakes_are_one_line(tmp_path, capsys):
    out = tmp_path / "o.yaml"
    for argv, message in ((["--measured-run", str(VLLM), "--out", str(out)], "needs --hw"),
                          (["--measured-run", str(VLLM), "--hw", "h100-sxm", "--update-shipped"], "never the shipped"),
                          (["--measured-run", str(tmp_path / "none.json"), "--hw", "h100-sxm", "--out", str(out)],
                           "")):
        assert fit_profiles.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err
        assert not out.exists()
