"""The published-row reader: every batch cell kind, lengths as tables print them, the stack's runtime and kernel,
source families, and every row of both training CSVs read or named (the data tests skip without ../shared)."""
from __future__ import annotations

import csv
import dataclasses
import math

import pytest

from sim.validation import published_gpu as pg
from sim.validation import published_kernels as pk
from sim.validation import published_rows as pr

HAVE_BOTH = all((pr.data_dir() / n).is_file() for n in pr.CSV_NAMES)
needs_data = pytest.mark.skipif(not HAVE_BOTH, reason=f"training CSVs not found in {pr.data_dir()} (set KVSIM_DATA)")
HAVE_KERNELS = pk.default_csv().is_file()


def _write(path, rows):
    header = list(pr.COLUMNS)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        for r in rows:
            base = dict(source="TRT012", hw="H100-SXM-80GB", model="meta-llama/Meta-Llama-3-8B",
                        stack="TensorRT-LLM v0.12.0 (trtllm-bench throughput; IFB max load)", weight_dtype="fp8",
                        kv_dtype="fp8", tp="1", batch="64", prompt="128", gen="128", metric="out_tok_per_s",
                        value="1000", notes="")
            base.update(r)
            w.writerow(base)
    return path


@pytest.mark.parametrize("cell, kind, batch, qps", [
    ("120", "static", 120, None), ("1 (concurrency)", "static", 1, None),
    ("dynamic (IFB max load; 2000 req)", "dynamic", None, None),
    ("64 (max_num_seqs; measured avg 63.92)", "max-seqs", 64, None),
    ("QPS 2 (request rate; arrival process not stated; batch dynamic)", "qps", None, 2.0),
    ("QPS INF (request rate; ...)", "qps", None, math.inf),
    ("max-throughput batch (TRT batch not stated)", "max-static", None, None),
    ("not stated (bs192 per TRT_F180 same value w/ XQA)", "static", 192, None),
])
def test_batch_cells(cell, kind, batch, qps):
    got = pr.batch_of(cell, "t")
    assert got[:3] == (kind, batch, qps)


def test_lengths_as_tables_print_them():
    assert pr.length_of("2048", "prompt", "t") == (2048, "")
    n, note = pr.length_of("388.7 mean (variable)", "gen", "t")
    assert n == 389 and "mean" in note
    assert pr.length_of("~483 mean (variable)", "gen", "t")[0] == 483
    n, note = pr.length_of("LMArena prompts (variable)", "prompt", "t")
    assert n > 0 and "assumed" in note and "datasets.yaml" in note
    with pytest.raises(ValueError, match="not an integer"):
        pr.length_of("whatever", "prompt", "t")


def test_stack_classes_pick_runtime_and_kernels():
    assert pr.classify_stack("TensorRT-LLM v0.9.0 static") == pr.Stack("trtllm", "classic", None, "masked-mha")
    assert pr.classify_stack("TensorRT-LLM v0.14.0 (trtllm-bench)").sliding_window_kernel is None
    assert pr.classify_stack("TensorRT-LLM 1.0 (PyTorch backend; IFB max load)").runtime == "pytorch"
    assert pr.classify_stack("TensorRT-LLM v0.8a (preliminary) XQA disabled").decode_kernel == "masked-mha"
    assert pr.classify_stack("vLLM 0.5.4 (mlenergy/vllm:v0.5.4-openai)").runtime == "vllm-v0"
    assert pr.classify_stack("vLLM 0.11.1 (async scheduling)").runtime == "vllm-v1"
    assert pr.classify_stack("QServe (OmniServe repo) W4A8KV4").engine is None
    assert pr.classify_stack("TensorRT-LLM (version not stated; QServe paper baseline; IFB off)").engine == "trtllm"
    assert pr.classify_stack("SGLang 0.4").engine is None


def test_unpredictable_cells_are_named_not_fatal(tmp_path):
    path = _write(tmp_path / "t.csv", [
        dict(batch="see notes"), dict(notes="SUSPECT (see sources)"),
        dict(batch="QPS INF (request rate)", metric="itl_ms", value="39"),
        dict(metric="median_itl_ms", batch="8 (max_num_seqs; measured avg 7.98)", stack="vLLM 0.11.1",
             prompt="LMArena prompts (variable)", gen="388.7 mean (variable)", value="7.3", weight_dtype="bf16",
             kv_dtype="bf16 (default)"),
        dict(metric="avg_tpot_s", batch="64 (max_num_seqs; measured avg 63.88)", stack="vLLM 0.5.4",
             prompt="ShareGPT (filtered)", gen="~483 mean (variable)", value="0.035", weight_dtype="bf16",
             kv_dtype="bf16"),
        dict(weight_dtype="mixed (as published; FP16 engine)", kv_dtype="fp16"),
    ])
    rows = pr.load_rows(path)
    assert "does not state the batch" in rows[0].scope
    assert "SUSPECT" in rows[1].scope
    assert "transient" in rows[2].scope
    assert rows[3].scope == "single-device" and rows[3].metric == "tpot_ms" and rows[3].batch_kind == "max-seqs"
    assert rows[3].runtime == "vllm-v1" and rows[3].gen == 389 and "median" in rows[3].notes
    assert rows[4].value == pytest.approx(35.0) and rows[4].runtime == "vllm-v0"
    assert rows[5].weight_dtype == "fp16" and "read as fp16" in rows[5].notes


def test_bad_integers_stay_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="row 1: batch '1k' is not an integer"):
        pr.load_rows(_write(tmp_path / "t.csv", [dict(batch="1k")]))


@needs_data
def test_every_row_of_both_csvs_is_read_or_named():
    rows = pr.load_rows()
    assert len(rows) == 149
    assert len(pr.in_scope(rows)) >= 130
    for r in rows:
        assert r.scope == "single-device" or r.scope.startswith("tp=") or len(r.scope) > 20   # a reason
        assert r.family in {"trt-static", "trt-inflight", "vllm", "qserve", "blogs"}
    kinds = {r.batch_kind for r in pr.in_scope(rows)}
    assert kinds == {"static", "dynamic", "max-seqs", "qps", "max-static"}


@needs_data
def test_every_in_scope_row_predicts_a_positive_value():
    from sim.profiles import engines as pe
    prof = pe.make_profile("trtllm", pe.prior_values())
    for r in pr.in_scope(pr.load_rows()):
        assert pg.predict_row(r, prof) > 0, r.id


@pytest.mark.skipif(not HAVE_KERNELS, reason="kernel CSV not found (set KVSIM_DATA)")
def test_kernel_rows_read_with_families_and_peaks():
    rows = pk.load_kernel_rows()
    assert len(rows) == 66
    assert {r.family for r in rows} == {"per-head", "cuda-core", "tensor-core"}
    assert all(r.peak_bw in (3352e9, 1935e9) for r in rows)


def test_an_ab_pair_is_fitted_as_its_ratio(tmp_path):
    """sources.yaml's ab_pairs: TRT_XQA's XQA-on row becomes its value over the XQA-off row (same cells but the
    stack), predicted as the ratio of the two predictions; the off row goes out of scope naming the ratio row."""
    from sim.profiles import engines as pe
    cells = dict(source="TRT_XQA", hw="H200-SXM-141GB", model="meta-llama/Llama-2-70b-hf", batch="192", prompt="128",
                 gen="64")
    path = _write(tmp_path / "ab.csv", [
        dict(cells, stack="TensorRT-LLM v0.8a (preliminary) XQA disabled", value="1227"),
        dict(cells, stack="TensorRT-LLM v0.8a (preliminary) XQA enabled", value="2941"),
        dict(cells, source="TRT_F180", stack="TensorRT-LLM v0.7a static", value="2941")])
    off, on, other = pr.load_rows(path)
    assert on.baseline == dataclasses.replace(off, scope="single-device") and on.value == pytest.approx(2941 / 1227)
    assert on.id.endswith("/over-row-1") and "A/B pair" in on.notes
    assert off.scope.startswith("the baseline of TRT_XQA's A/B pair") and "row 2" in off.scope
    assert other.baseline is None and other.value == 2941           # another source's row is left as it is
    prof = pe.make_profile("trtllm", pe.prior_values())
    level_on = pg.predict_row(dataclasses.replace(on, baseline=None, value=2941.0), prof)
    level_off = pg.predict_row(on.baseline, prof)
    assert level_on > level_off                                      # the tensor-core kernel beats masked MHA
    assert pg.predict_row(on, prof) == pytest.approx(level_on / level_off)
    with pytest.raises(ValueError, match="out of scope"):
        pg.predict_row(off, prof)
