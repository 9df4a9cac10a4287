"""sim.validation.multigpu: the published tp > 1 rows against sim.parallel."""
import pytest

from sim.models import load_model
from sim.validation import multigpu
from sim.validation import published_gpu as pg

needs_csv = pytest.mark.skipif(not pg.default_csv().is_file(), reason="../shared/data/gpu-published-train.csv absent")


def test_itl_from_notes():
    assert multigpu.itl_ms("ITL 18.58 ms; 51.67 tok/s") == 18.58
    assert multigpu.itl_ms("~8.4 ms/step") is None


def test_llama3_70b_shapes():
    m = load_model("meta/llama-3.3-70b-instruct (NIM 1.8.0)")       # the NIM row's label
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.d_ff, m.vocab_size) == (80, 8192, 64, 8, 28672, 128256)
    assert m.n_params() == pytest.approx(70.6e9, rel=0.01)


@needs_csv
def test_multigpu_rows_are_predicted_within_30_percent_by_their_stack_profile():
    recs = multigpu.report()
    assert {(r["source"], r["tp"], r["metric"]) for r in recs} >= {
        ("NIM", 2, "ttft_ms"), ("NIM", 2, "tpot_ms"), ("AMD_PERF", 8, "e2e_latency_s")}
    for r in recs:
        assert abs(r["error_pct_stack"]) < 30, r


@needs_csv
def test_cli_prints_one_line_per_row(capsys):
    assert multigpu.main([]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == len(multigpu.rows())
