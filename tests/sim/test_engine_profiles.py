"""Engine profiles trtllm / vllm / hf: registered from data with provenance, physical, and fitted by one
command; the published-GPU CSV loader and the validate section (tests that need the CSV skip without it)."""
from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest
import yaml

from sim import engine, fit_profiles, validate
from sim.models import load_model
from sim.profiles import engines as pe
from sim.profiles import get_profile
from sim.validation import published_gpu as pg
from sim.validation import published_kernels as pk
from sim.validation import published_report

HAVE_CSV = pg.default_csv().is_file()
needs_csv = pytest.mark.skipif(not HAVE_CSV, reason=f"published GPU CSV not found at {pg.default_csv()} "
                                                    "(set KVSIM_DATA)")
HEADER = list(pg.COLUMNS)


def _row(**kw):
    base = dict(source="S1", hw="H100-SXM-80GB", model="meta-llama/Llama-2-7b-hf", stack="TensorRT-LLM v0.9.0 static",
                weight_dtype="fp8", kv_dtype="fp8", tp="1", batch="64", prompt="128", gen="2048",
                metric="out_tok_per_s", value="5000", notes="")
    base.update({k: str(v) for k, v in kw.items()})
    return base


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADER)
        w.writeheader()
        w.writerows(rows)
    return path


# ---------------------------------------------------------------------------------------------------
# Profiles as data

def test_shipped_file_has_provenance_and_terms_in_bounds():
    data = pe.read_fit_file()
    fit = data["fit"]
    assert fit["command"].startswith("python -m sim.fit_profiles") and all(len(h) == 64 for h in fit["csv_sha256"])
    assert fit["date"] and all(c.startswith("..") for c in fit["csv"])   # relative, never one machine's path
    assert fit["kernels"].startswith("..") and len(fit["kernels_sha256"]) == 64
    assert "/root" not in pe.FIT_FILE.read_text() and "/work" not in pe.FIT_FILE.read_text()
    for engine_name in ("trtllm", "vllm"):
        entry = data["engines"][engine_name]
        values = pe.engine_values(data, engine_name)
        assert len(values) == len(pe.TERMS) <= 20       # few named terms
        for t in pe.TERMS:
            term = entry["terms"][t.name]
            assert t.lo <= values[t.name] <= t.hi and term["source"] and term["meaning"]
        assert entry["fitted"] is True
    assert set(data["engines"]["trtllm"]["loso_folds"]) == {"trt-static", "trt-inflight", "vllm", "qserve", "blogs"}


def test_profiles_registered_with_the_files_values():
    data = pe.read_fit_file()
    trt = get_profile("trtllm")
    assert trt.host_overhead_s == pytest.approx(data["engines"]["trtllm"]["terms"]["step_overhead_s"]["value"])
    assert trt.launch_overhead_s == pytest.approx(data["engines"]["trtllm"]["terms"]["launch_overhead_s"]["value"])
    assert get_profile("vllm").name == "vllm" and get_profile("hf").eager


def test_bad_profile_values_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="outside its bounds"):
        pe.make_profile("trtllm", dict(pe.prior_values(), gemm_eff=3.0))
    with pytest.raises(ValueError, match="missing terms"):
        pe.check_values({"gemm_eff": 0.9}, "x")
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        pe.read_fit_file(bad)


@pytest.mark.parametrize("hw", ["h100-sxm", "h200-sxm", "a100-80g-sxm", "l40s"])
@pytest.mark.parametrize("model", ["llama-2-7b", "mistral-7b-v0.1", "llama-3-8b", "llama-2-70b"])
def test_trtllm_respects_the_bandwidth_floor(hw, model):
    rng = np.random.default_rng(0)
    device = engine.resolve_device(hw)
    for _ in range(4):
        batch, ctx = int(rng.integers(1, 256)), float(rng.integers(16, 8192))
        for profile in ("trtllm", "vllm"):
            t = engine.decode_step_time(hw, model, np.full(batch, ctx), weight_dtype="fp8", kv_dtype="fp8",
                                        profile=profile)
            s = engine.make_setup(hw, model, "full", "fp8", "fp8", profile)
            floor = (s.model.weight_bytes("fp8") + batch * ctx * s.model.kv_bytes_per_token("fp8")) / device.memory_bw
            assert t >= floor * (1 - 1e-9)


def test_per_head_kernel_costs_more_than_the_grouped_one_on_gqa():
    """Same bytes, a per-head (masked multi-head) kernel re-reads the group's K/V and computes per query head:
    a slow CUDA-core rate makes it the bound, the tensor-core (XQA-class) kernel stays bandwidth-bound."""
    low = dict(pe.prior_values(), attn_mmha_core_eff=0.05)
    kw = dict(weight_dtype="fp8", kv_dtype="fp8")
    kv = np.full(64, 2048.0)
    masked = pe.make_profile("trtllm", low, kernels=pe.Kernels("trtllm", sliding_window_kernel="masked-mha"))
    per_head = engine.decode_step_time("h100-sxm", "mistral-7b-v0.1", kv, profile=masked, **kw)
    grouped = engine.decode_step_time("h100-sxm", "mistral-7b", kv, profile=pe.make_profile("trtllm", low), **kw)
    assert per_head > 1.5 * grouped


def test_pytorch_runtime_hides_launches_and_host_work_but_not_the_kernels():
    base = get_profile("trtllm")
    variant = pe.pytorch_runtime(base)
    assert variant is pe.pytorch_runtime(base)                       # one variant per profile object
    assert variant.launch_overhead_s <= pe.PYTORCH_RUNTIME_KERNEL_GAP_S and variant.host_overhead_s == 0.0
    assert get_profile("trtllm-pytorch").launch_overhead_s == variant.launch_overhead_s
    kw = dict(weight_dtype="fp8", kv_dtype="fp8")
    kv = np.full(64, 2048.0)
    t_base = engine.decode_step_time("h200-sxm", "llama-3-8b", kv, profile=base, **kw)
    t_var = engine.decode_step_time("h200-sxm", "llama-3-8b", kv, profile=variant, **kw)
    assert t_var < t_base
    # the kernels' own time stays: never below the bandwidth floor (weights + KV bytes) / peak bandwidth
    m, dev = load_model("llama-3-8b"), engine.resolve_device("h200-sxm")
    floor = (m.weight_bytes("fp8") + kv.sum() * m.kv_bytes_per_token("fp8")) / dev.memory_bw
    assert t_var >= floor


def test_context_overhead_is_paid_once_per_prefill_pass_by_the_classic_runtime_only():
    """context_overhead_s: a classic-runtime prefill pass costs exactly that much more (one operator row,
    `context_setup`); decode steps and the PyTorch backend do not pay it."""
    values = dict(pe.prior_values(), context_overhead_s=2e-3)
    kw = dict(batch=np.array([1.0, 8.0]), prompt=np.array([128.0, 2048.0]), gen=np.array([64.0, 64.0]),
              with_capacity=False)

    def run(profile):
        return engine.evaluate("h100-sxm", "llama-3-8b", "full", profile=profile, **kw)

    with_term, without = run(pe.make_profile("trtllm", values)), run(pe.make_profile("trtllm", pe.prior_values()))
    np.testing.assert_allclose(with_term["ttft_s"] - without["ttft_s"], 2e-3, rtol=1e-9)
    np.testing.assert_array_equal(with_term["tpot_s"], without["tpot_s"])
    pytorch = run(pe.make_profile("trtllm", values, runtime="pytorch"))
    np.testing.assert_array_equal(pytorch["ttft_s"], run(pe.make_profile("trtllm", pe.prior_values(),
                                                                         runtime="pytorch"))["ttft_s"])
    assert pe.pytorch_runtime(pe.make_profile("trtllm", values)).extra_prefill_ops is None
    # a DES step holding several requests' prefill chunks is one context pass: the term once, not per chunk
    from sim.engine.steps import mixed_step_time
    for chunks in ([(512, 0)], [(512, 0), (256, 0), (128, 1024, False)]):
        step = lambda v: mixed_step_time("h100-sxm", "llama-3-8b", [300.0] * 4, chunks, profile=pe.make_profile("trtllm", v))
        assert step(values) - step(pe.prior_values()) == pytest.approx(2e-3, rel=1e-9)


@needs_csv
def test_published_rows_name_their_runtime():
    rows = pg.load_rows()
    runtimes = {r.source: r.runtime for r in rows if r.engine is not None}
    assert runtimes["TRT10"] == "pytorch" and runtimes["TRT090"] == "classic" and runtimes["TRT_F180"] == "classic"
    assert runtimes["MLE2"] == "vllm-v0" and runtimes["MLE3"] == "vllm-v1"
    r = next(r for r in pg.in_scope(rows) if r.source == "TRT10")
    trt = get_profile("trtllm")
    # a PyTorch-backend row runs the engine profile under that runtime: faster than the classic runtime's
    classic = dataclasses.replace(r, runtime="classic")
    assert pg.predict_row(r, trt) > pg.predict_row(classic, trt)
    assert pg.predict_row(r, "fused") == pytest.approx(pg.predict_row(classic, "fused"))   # fused is as named


def test_hf_profile_operators():
    """SDPA: no materialised scores, no repeat_kv (native GQA), DynamicCache cat, greedy (no reorder)."""
    p = engine.predict("h100-sxm", "llama-3-8b", 4, 1024, 16, "full", 1.0, profile="hf")
    ops = set(p.decode_ops["op"])
    assert "cache_concat" in ops and "generate_step" in ops and "eager_glue" in ops
    assert not ops & {"repeat_kv", "beam_reorder", "mask_bias", "score_upcast"}
    eager = set(engine.predict("h100-sxm", "llama-3-8b", 4, 1024, 16, "full", 1.0, profile="hf-eager").decode_ops["op"])
    assert "repeat_kv" in eager
    assert p.tpot_s < engine.predict("h100-sxm", "llama-3-8b", 4, 1024, 16, "full", 1.0, profile="hf-eager").tpot_s


# ---------------------------------------------------------------------------------------------------
# The CSV

def test_loader_scopes_and_regimes(tmp_path):
    path = write_csv(tmp_path / "p.csv", [
        _row(),
        _row(tp=8, hw="MI300X-192GB (x8)"),
        _row(batch=1, prompt=2048, gen=1, metric="ttft_ms", value=30),
        _row(model="mistralai/Mistral-7B-v0.1", batch=120),
        _row(batch="dynamic", prompt=5000, gen=500),
        _row(batch=1, prompt=128, gen=1, metric="ttft_ms", value=6),
        _row(hw="B100"),
    ])
    rows = pg.load_rows(path)
    assert [r.scope == "single-device" for r in rows] == [True, False, True, True, True, True, False]
    assert "multi-GPU" in rows[1].scope and rows[4].batch is None
    assert [r.regime for r in rows[:6]] == ["large-batch-decode", "large-batch-decode", "prefill-ttft",
                                            "gqa-large-batch", "long-context", "batch-1"]
    assert rows[3].model == "mistral-7b-v0.1"
    assert pg.predict_row(rows[4], "fused") > 0
    with pytest.raises(ValueError, match="out of scope"):
        pg.predict_row(rows[1], "fused")


@pytest.mark.parametrize("bad, message", [(dict(value="x"), "not a number"),
                                          (dict(batch="many"), "batch"), (dict(value="-3"), "positive")])
def test_loader_errors_name_the_row(tmp_path, bad, message):
    path = write_csv(tmp_path / "p.csv", [_row(), _row(**bad)])
    with pytest.raises(ValueError, match=f"row 2: .*{message}"):
        pg.load_rows(path)


def test_data_dir_is_relative_and_configurable(monkeypatch, tmp_path):
    monkeypatch.delenv("KVSIM_DATA", raising=False)
    assert pg.data_dir() == (pg.REPO_ROOT.parent / "shared" / "data").resolve()
    monkeypatch.setenv("KVSIM_DATA", str(tmp_path))
    assert pg.default_csv() == tmp_path.resolve() / pg.CSV_NAME


# ---------------------------------------------------------------------------------------------------
# The fit

@pytest.mark.slow
def test_fit_recovers_terms_behind_synthetic_measurements(tmp_path):
    """Rows whose 'measurements' the model itself made with known terms: the fit finds terms that
    reproduce them (the physics is identifiable from these shapes)."""
    truth = dict(pe.prior_values(), step_overhead_s=0.0015, launch_overhead_s=2e-6, gemm_eff=0.8, fp8_gemm_eff=0.7,
                 attn_mmha_core_eff=0.2, attn_fp8_kv_eff=0.7)
    shapes = [("H100-SXM-80GB", "mistralai/Mistral-7B-v0.1", "fp8", 120, 128, 2048, "out_tok_per_s"),
              ("A100-SXM-80GB", "mistralai/Mistral-7B-v0.1", "fp16", 120, 128, 2048, "out_tok_per_s"),
              ("L40S-48GB", "mistralai/Mistral-7B-v0.1", "fp8", 120, 128, 2048, "out_tok_per_s"),
              ("H200-SXM-141GB", "meta-llama/Llama-2-7b-hf", "fp8", 1, 2048, 1, "ttft_ms"),
              ("A100-SXM-80GB", "meta-llama/Llama-2-7b-hf", "fp16", 1, 2048, 1, "ttft_ms"),
              ("H100-SXM-80GB", "meta-llama/Llama-2-7b-hf", "fp8", 1, 128, 1, "ttft_ms"),
              ("H200-SXM-141GB", "meta-llama/Llama-2-7b-hf", "fp8", 8, 128, 256, "out_tok_per_s"),
              ("H100-SXM-80GB", "meta-llama/Llama-2-7b-hf", "fp8", 120, 128, 2048, "out_tok_per_s")] * 3
    rows = [_row(hw=h, model=m, weight_dtype=d, kv_dtype=d, batch=b + i // 8, prompt=n, gen=g, metric=metric, value=1)
            for i, (h, m, d, b, n, g, metric) in enumerate(shapes)]
    scoped = pg.in_scope(pg.load_rows(write_csv(tmp_path / "s.csv", rows)))
    measured = fit_profiles.predictions(scoped, truth)
    for r, v in zip(rows, measured):
        r["value"] = f"{v:.6g}"
    scoped = pg.in_scope(pg.load_rows(write_csv(tmp_path / "s.csv", rows)))
    fitted = fit_profiles.fit_terms(scoped, [])
    pred = fit_profiles.predictions(scoped, fitted)
    assert np.max(np.abs(pred / measured - 1)) < 0.03


def test_fit_descends_on_little_s_law_but_fits_the_des_values_of_rate_rows(tmp_path, monkeypatch):
    """Request-rate rows are predicted by the DES; the descent runs on Little's law times a factor per row
    re-evaluated between descents. With a stand-in DES 30% above Little's law, the fit still reproduces
    measurements the DES made; fitting Little's law alone (no rounds) leaves the rate rows off."""
    monkeypatch.setattr(pg, "des_rate", lambda row, profile: 1.3 * pg._rate(row, pg.row_profile(row, profile)))
    truth = dict(pe.prior_values(), step_overhead_s=0.0015, gemm_eff=0.8)
    rows = [_row(hw="H100-SXM-80GB", model="meta-llama/Llama-2-7b-hf", batch=b, prompt=n, gen=g, metric=m,
                 weight_dtype="fp16", kv_dtype="fp16", value=1)
            for b, n, g, m in [(1, 2048, 1, "ttft_ms"), (8, 128, 256, "out_tok_per_s"), (64, 128, 512, "out_tok_per_s")]]
    rows += [_row(hw="H100-SXM-80GB", model="meta-llama/Llama-2-7b-hf", batch=f"QPS {q}", prompt=256, gen=128,
                  metric=m, stack="TensorRT-LLM v0.14.0", weight_dtype="fp16", kv_dtype="fp16", value=1)
             for q, m in [(2, "ttft_ms"), (4, "tpot_ms")]]
    scoped = pg.in_scope(pg.load_rows(write_csv(tmp_path / "s.csv", rows)))
    measured = fit_profiles.predictions(scoped, truth)
    for r, v in zip(rows, measured):
        r["value"] = f"{v:.6g}"
    scoped = pg.in_scope(pg.load_rows(write_csv(tmp_path / "s.csv", rows)))
    rate = np.array([pg.is_rate_row(r) for r in scoped])
    assert rate.sum() == 2
    pred = fit_profiles.predictions(scoped, fit_profiles.fit_terms(scoped, []))
    assert np.max(np.abs(pred / measured - 1)) < 0.03
    monkeypatch.setattr(fit_profiles, "DES_ROUNDS", 0)
    little_only = fit_profiles.predictions(scoped, fit_profiles.fit_terms(scoped, []))
    assert np.max(np.abs(little_only[rate] / measured[rate] - 1)) > 0.1


def test_rate_rows_run_the_des_once_per_run(tmp_path, monkeypatch):
    """A TTFT row and a TPOT row of the same run share one DES run; des=False gives Little's law."""
    import sim.des.serving as serving
    monkeypatch.setattr(pg, "_DES_RUNS", {})        # no run memoised by an earlier test
    calls = []
    simulate = serving.simulate
    monkeypatch.setattr(serving, "simulate", lambda *a, **k: calls.append(k["qps"]) or simulate(*a, **k))
    path = write_csv(tmp_path / "q.csv", [
        _row(batch="QPS 3", stack="TensorRT-LLM v0.14.0", metric=m, value=8, weight_dtype="bf16", kv_dtype="bf16",
             prompt=128, gen=32) for m in ("ttft_ms", "tpot_ms")])
    ttft, tpot = pg.in_scope(pg.load_rows(path))
    prof = pe.make_profile("trtllm", pe.prior_values(), name="t")
    des = [pg.predict_row(r, prof) for r in (ttft, tpot)]
    assert calls == [3.0] and des[0] > des[1] > 0
    assert pg.predict_row(ttft, prof, des=False) == pytest.approx(pg._rate(ttft, pg.row_profile(ttft, prof)))


def test_row_terms_cover_every_term_a_prediction_reads(tmp_path):
    """The sparse Jacobian re-predicts only the rows a term reaches (fit_profiles.row_terms): moving any other
    term must leave a row's prediction exactly as it was."""
    path = write_csv(tmp_path / "r.csv", [
        _row(), _row(model="mistralai/Mistral-7B-v0.1", batch=120),
        _row(batch="dynamic", prompt=2048, gen=2048, stack="TensorRT-LLM v0.14.0"),
        _row(batch="64 (max_num_seqs)", stack="vLLM 0.5.4", weight_dtype="bf16", kv_dtype="bf16", metric="tpot_ms",
             value=30),
        _row(batch="QPS 2", stack="TensorRT-LLM v0.14.0", metric="itl_ms", value=8, weight_dtype="bf16",
             kv_dtype="bf16")])
    rows = pg.in_scope(pg.load_rows(path))
    base = dict(pe.prior_values(), attn_core_eff=0.1, attn_mmha_core_eff=0.1, attn_fp8_kv_eff=0.5)
    before = fit_profiles.predictions(rows, base, des=False)      # the descent's path (Little's law for rates)
    for t in pe.FITTED_TERMS:
        moved = dict(base, **{t.name: t.lo + 0.37 * (t.hi - t.lo)})
        after = fit_profiles.predictions(rows, moved, des=False)
        for r, a, b in zip(rows, after, before):
            if t.name not in fit_profiles.row_terms(r):
                assert a == b, (t.name, r.id)


def test_fit_cli_errors_are_one_line(tmp_path, capsys):
    assert fit_profiles.main(["--csv", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not (tmp_path / "o.yaml").exists()
    assert fit_profiles.main(["--csv", str(tmp_path / "missing.csv"), "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    few = write_csv(tmp_path / "few.csv", [_row()])
    kernels = tmp_path / "kernels.csv"      # the row count is refused before the kernel rows are read
    kernels.write_text(",".join(pk.COLUMNS) + "\n")
    assert fit_profiles.main(["--csv", str(few), "--kernels", str(kernels), "--out", str(tmp_path / "o.yaml")]) == 2
    assert "need more than" in capsys.readouterr().err and not (tmp_path / "o.yaml").exists()
    assert fit_profiles.main(["--bogus"]) == 2


# ---------------------------------------------------------------------------------------------------
# The validate section (needs the CSV)

@needs_csv
def test_section_reports_in_sample_beside_loso_per_regime():
    section = published_report.build_section()
    s = section.summary
    assert s["rows"] == len(section.table) > 20
    assert set(s["regimes"]) >= {"batch-1", "large-batch-decode", "gqa-large-batch", "prefill-ttft", "long-context",
                                 "overall"}
    for stats in s["regimes"].values():
        assert {"in_sample_mape", "loso_mape", "loso_max", "status"} <= set(stats)
    assert any(e.startswith("AMD_PERF") or e.startswith("NIM") for e in s["excluded"])   # tp > 1 rows
    assert not (section.table["batch"] == "dynamic").all()
    text = "\n".join(section.markdown)
    assert "LOSO" in text and "no GPU was lent" in text


@needs_csv
def test_section_flags_a_stale_fit(tmp_path):
    data = pe.read_fit_file()
    for p in data["predictions"]:
        p["in_sample"] *= 1.2
    stale = tmp_path / "stale.yaml"
    stale.write_text(yaml.safe_dump(data))
    section = published_report.build_section(stale)
    assert section.summary["stale"] and "stale" in "\n".join(section.markdown)


def test_section_skips_without_the_csv(tmp_path):
    section = published_report.build_section(csv=tmp_path / "none.csv")
    assert "skipped" in section.summary and "Skipped" in section.markdown[2]


def test_validate_cli_published_gpu_flag_errors(tmp_path, capsys):
    code = validate.main(["--out", str(tmp_path / "v"), "--no-measured", "--published-gpu", str(tmp_path / "x.csv"),
                          "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


@needs_csv
def test_validate_json_carries_the_section(tmp_path, capsys):
    assert validate.main(["--out", str(tmp_path / "v"), "--no-measured", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["published_gpu"]["regimes"]["overall"]["points"] > 20
    assert "Published GPU measurements" in (tmp_path / "v" / "validation-report.md").read_text()


@needs_csv
def test_rows_outside_the_training_csv_are_held_out(tmp_path):
    """Another CSV (the held-out check): rows the fit never saw are reported as held out, and a
    single-device vLLM row is predicted under the vllm profile."""
    path = write_csv(tmp_path / "held.csv", [
        _row(source="NEW", batch=32, prompt=512, gen=512, value=2000),
        _row(source="NEWV", stack="vLLM 0.6", hw="H200-SXM-141GB", batch=16, prompt=1024, gen=256, value=1500),
    ])
    section = published_report.build_section(csv=path)
    t = section.table
    assert list(t["trained"]) == [False, False] and list(t["engine"]) == ["trtllm", "vllm"]
    assert (t["loso"] == t["predicted"]).all()           # out of sample in every column
    assert section.summary["held_out"]["points"] == 2
    assert "held out" in "\n".join(section.markdown)
    json.dumps(section.summary, allow_nan=False)         # strict JSON: no NaN interval
    one = published_report.build_section(csv=write_csv(tmp_path / "one.csv", [_row(source="NEW", batch=32, prompt=512,
                                                                                   gen=512, value=2000)]))
    # one source: nothing to resample, no interval (None in the summary, the bare MAPE in the table)
    assert one.summary["regimes"]["overall"]["loso_ci"] is None
    json.dumps(one.summary, allow_nan=False)


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hw=st.sampled_from(["h100-sxm", "h200-sxm", "a100-80g-sxm", "l40s", "mi300x"]),
       model=st.sampled_from(["llama-2-7b", "mistral-7b-v0.1", "llama-3-8b", "gpt-j-6b", "mixtral-8x7b"]),
       profile=st.sampled_from(["trtllm", "vllm", "hf"]), policy=st.sampled_from(["h2o", "keyformer", "window"]),
       batch=st.integers(1, 128), prompt=st.integers(64, 16384), gen=st.integers(2, 1024),
       ratios=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=2), dtype=st.sampled_from(["fp8", "bf16"]))
def test_engine_profiles_never_get_faster_with_more_cache(hw, model, profile, policy, batch, prompt, gen, ratios,
                                                          dtype):
    lo, hi = sorted(ratios)
    kw = dict(batch=batch, prompt=prompt, gen=gen, kv_dtype=dtype, weight_dtype=dtype, profile=profile,
              with_capacity=False)
    small = engine.evaluate(hw, model, policy, cache_ratio=lo, **kw)["tpot_s"][0]
    large = engine.evaluate(hw, model, policy, cache_ratio=hi, **kw)["tpot_s"][0]
    assert small <= large * (1 + 1e-12)


# ---------------------------------------------------------------------------------------------------
# Another CSV (the held-out check): names as vendors print them, rows kvsim cannot predict, tp > 1

def test_held_out_csv_resolves_published_names_and_says_why_it_skips_a_row(tmp_path):
    path = write_csv(tmp_path / "held.csv", [
        _row(source="HO", hw="H100 SXM5 80GB", model="meta-llama/Meta-Llama-3-8B-Instruct", batch=64, prompt=128,
             gen=128, value=9000),
        _row(source="HO", hw="H100 PCIe", value=100),
        _row(source="HO", model="deepseek-ai/DeepSeek-V3", value=100),
        _row(source="HO", weight_dtype="w4a16", value=100),
        _row(source="HO", hw="H100-SXM-80GB (x2)", model="meta-llama/Llama-3.1-70B-Instruct", tp=2, batch=8,
             prompt=1024, gen=128, value=500),
        _row(source="HO", hw="H200", model="Llama 3.3 70B", tp=2, batch="dynamic", prompt=128, gen=2048, value=5000,
             stack="TensorRT-LLM 1.0 (PyTorch backend)"),
    ])
    rows = pg.load_rows(path)
    assert [r.scope == "single-device" for r in rows] == [True, False, False, False, False, False]
    assert rows[0].model == "llama-3-8b" and rows[0].hw == "h100-sxm"
    assert "PCIe" in rows[1].scope and "mixture-of-experts" in rows[2].scope and "w4a16" in rows[3].scope
    assert rows[4].model == "llama-3.1-70b" and "multi-GPU" in rows[4].scope
    section = published_report.build_section(csv=path)
    assert list(section.table["trained"]) == [False]
    multi = section.summary["multi_gpu"]
    assert [m["id"].split("/")[1] for m in multi] == ["h100-sxmx2", "h200-sxmx2"]
    assert all(m["predicted_stack"] > 0 for m in multi)
    # in-flight batching on 2 devices: the steady-state batch of their pooled KV memory, not batch 1
    assert multi[1]["id"].split("/")[3].startswith("dyn(b") and rows[5].runtime == "pytorch"
    assert int(multi[1]["id"].split("/")[3][5:-1]) == int(pg.steady_state_batch(rows[5])) > pg.steady_state_batch(
        dataclasses.replace(rows[5], tp=1))
    text = "\n".join(section.markdown)
    assert "Multi-GPU rows" in text and "PCIe" in text and "mixture-of-experts" in text


def test_csv_as_a_spreadsheet_writes_it_reads_and_an_empty_file_says_so(tmp_path):
    plain = write_csv(tmp_path / "plain.csv", [_row(), _row(batch=8)]).read_text()
    header, body = plain.split("\n", 1)
    # a BOM, CRLF line ends, headers in title case with spaces: the same rows
    typed = header.replace("weight_dtype", "Weight dtype").replace("kv_dtype", " KV-dtype").upper()
    messy = tmp_path / "messy.csv"
    messy.write_bytes(b"\xef\xbb\xbf" + (typed + "\n" + body).replace("\n", "\r\n").encode())
    same = pg.load_rows(tmp_path / "plain.csv")
    assert [(r.id, r.value, r.kv_dtype) for r in pg.load_rows(messy)] == [(r.id, r.value, r.kv_dtype) for r in same]
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty file") as info:
        pg.load_rows(empty)
    assert "\n" not in str(info.value)


def test_integer_cells_as_tables_print_them(tmp_path):
    path = write_csv(tmp_path / "ints.csv", [_row(tp="TP2", batch="1 (concurrency)", prompt="2,048", gen="x128"),
                                             _row(tp="tp=1", batch="8x", prompt="128", gen="128")])
    rows = pg.load_rows(path)
    assert [(r.tp, r.batch, r.prompt, r.gen) for r in rows] == [(2, 1, 2048, 128), (1, 8, 128, 128)]
    for cell, message in (("1k", "prompt '1k' is not an integer"), ("8.5", "is not an integer"),
                          ("-8", "prompt must be a positive integer, got -8"), ("1,2", "is not an integer")):
        with pytest.raises(ValueError, match=message) as info:
            pg.load_rows(write_csv(tmp_path / "bad.csv", [_row(prompt=cell)]))
        assert "row 1" in str(info.value) and "\n" not in str(info.value)


def test_metrics_in_other_units_and_per_gpu_are_converted(tmp_path):
    path = write_csv(tmp_path / "units.csv", [
        _row(metric="ttft_s", value="0.0302", batch=1, prompt=2048, gen=1),
        _row(metric="out_tok_per_s_per_gpu", value="1,000", tp=4, notes="from a chart"),
        _row(metric="e2e_latency_ms", value="17236", batch=1), _row(metric="ITL_S", value="0.01858", batch=1)])
    rows = pg.load_rows(path)
    assert [(r.metric, r.value) for r in rows] == [("ttft_ms", pytest.approx(30.2)), ("out_tok_per_s", 4000.0),
                                                   ("e2e_latency_s", pytest.approx(17.236)),
                                                   ("tpot_ms", pytest.approx(18.58))]
    assert rows[0].notes == "published as ttft_s = 0.0302"
    assert rows[1].notes == "published as out_tok_per_s_per_gpu = 1,000; from a chart"
    assert rows[0].scope == "single-device" and "multi-GPU" in rows[1].scope


def test_held_out_mixtral_and_falcon_rows_are_predicted(tmp_path):
    path = write_csv(tmp_path / "moe.csv", [
        _row(source="HO", model="mistralai/Mixtral-8x7B-Instruct-v0.1", batch=1, prompt=128, gen=128,
             metric="tpot_ms", value=10),
        _row(source="HO", model="meta-llama/Llama-2-70b-hf", batch=1, prompt=128, gen=128, metric="tpot_ms", value=30),
        _row(source="HO", hw="H100 SXM", model="tiiuae/falcon-180B", tp=8, batch=64, prompt=128, gen=512, value=3000),
    ])
    rows = pg.load_rows(path)
    assert [r.model for r in rows] == ["mixtral-8x7b", "llama-2-70b", "falcon-180b"]
    assert [r.scope == "single-device" for r in rows] == [True, True, False] and rows[2].predictable
    mixtral, dense70 = (pg.predict_row(r, "trtllm") for r in rows[:2])
    # a decode step of Mixtral at batch 1 streams its 12.9 B active parameters, not its 46.7 B
    assert 0 < mixtral < 0.4 * dense70
    multi = published_report.build_section(csv=path).summary["multi_gpu"]
    assert [m["id"].split("/")[1] for m in multi] == ["h100-sxmx8"] and multi[0]["predicted_stack"] > 0


def test_held_out_csv_with_no_predictable_row_still_reports(tmp_path):
    path = write_csv(tmp_path / "none.csv", [_row(hw="B100"), _row(model="microsoft/phi-2"),
                                             _row(stack="SGLang 0.4"), _row(stack="SGLang 0.4", tp=2)])
    rows = pg.load_rows(path)
    assert rows[2].engine is None and "no engine profile for stack 'SGLang 0.4'" in rows[2].scope
    section = published_report.build_section(csv=path)
    assert section.summary["rows"] == 0 and len(section.summary["excluded"]) == 4
    assert not section.summary["multi_gpu"]              # the tp = 2 SGLang row is not predicted under trtllm
    assert "can be predicted" in "\n".join(section.markdown) and "Blackwell" in "\n".join(section.markdown)


def test_validate_with_only_a_published_csv_writes_that_section_and_its_plot(tmp_path, capsys):
    path = write_csv(tmp_path / "held.csv", [_row(source="HO", batch=32, value=3000),
                                             _row(source="HO", batch=1, prompt=2048, gen=1, metric="ttft_ms", value=30)])
    out = tmp_path / "v"
    assert validate.main(["--out", str(out), "--no-measured", "--no-references", "--published-gpu", str(path),
                          "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["published_gpu"]["rows"] == 2 and summary["published_gpu"]["held_out"]["points"] == 2
    report = (out / "validation-report.md").read_text()
    assert "Published GPU measurements" in report and "Summary" not in report
    assert (out / "published-gpu-parity.png").stat().st_size > 10_000
    assert validate.main(["--out", str(out), "--no-measured", "--no-references", "--no-published-gpu"]) == 2
    assert "nothing to validate" in capsys.readouterr().err


def test_loader_reads_tables_as_printed_without_notes(tmp_path):
    path = tmp_path / "p.csv"
    cols = [c for c in HEADER if c != "notes"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerow({k: v for k, v in _row(value="8,950").items() if k in cols})
    (row,) = pg.load_rows(path)
    assert row.value == 8950 and row.notes == "" and row.scope == "single-device"
    batches = ("dynamic", "IFB", "max load", "1 (concurrency)")
    rows = pg.load_rows(write_csv(tmp_path / "d.csv", [_row(batch=b) for b in batches]))
    assert [r.batch for r in rows] == [None, None, None, 1]
    rows = pg.load_rows(write_csv(tmp_path / "m.csv", [_row(metric="ITL_ms", value=12), _row(metric="req_per_s"),
                                                        _row(metric="ttft_ms", batch="dynamic")]))
    assert rows[0].metric == "tpot_ms" and rows[0].scope == "single-device"
    assert pg.predict_row(rows[0], "fused") == pytest.approx(
        engine.predict("h100-sxm", "llama-2-7b", 64, 128, 2048, "full", 1.0, kv_dtype="fp8", weight_dtype="fp8",
                       profile="fused").tpot_s * 1e3, rel=1e-6)
    assert "req_per_s" in rows[1].scope and "out_tok_per_s only" in rows[2].scope


def test_kv_pool_leaves_the_model_sized_buffers_and_follows_each_stack(tmp_path):
    """TensorRT-LLM's pool is a fraction of the memory left free, vLLM's a fraction of all memory; both after
    the weights (16-bit embedding and LM head in an FP8 checkpoint), the derived buffers and the reserve."""
    rows = pg.load_rows(write_csv(tmp_path / "p.csv", [
        _row(batch="dynamic", model="meta-llama/Llama-3.1-70B", stack="TensorRT-LLM v0.14.0"),
        _row(batch="64 (max_num_seqs)", model="meta-llama/Llama-3.1-70B", stack="vLLM 0.5.4", metric="tpot_ms",
             value="30"),
        _row(batch="dynamic", model="meta-llama/Llama-3.1-8B", stack="TensorRT-LLM v0.14.0"),
    ]))
    trt, vllm, small = rows
    assert (trt.engine, vllm.engine) == ("trtllm", "vllm")
    total, weights, per_token = pg._memory(trt)
    assert weights > 72e9                       # 70.55B parameters, 2.1B of them held at 16 bits
    profile = pe.make_profile("trtllm", dict(pe.prior_values(), runtime_reserve_gb=1.5))
    held = weights + 1.5e9 + pg.engine_buffers(trt)
    assert pg._pool_tokens(trt, profile) * per_token == pytest.approx(0.9 * (total - held))
    held_vllm = weights + 1.5e9 + pg.engine_buffers(vllm)
    assert pg._pool_tokens(vllm, profile) * per_token == pytest.approx(max(0.9 * total - held_vllm, 0.0))
    # the buffers: activations of max_num_tokens tokens and logits of the largest batch grow with the model;
    # vLLM sizes its logits by the row's cap, TensorRT-LLM by max_batch_size
    assert pg.engine_buffers(trt) > pg.engine_buffers(small) > 1e9
    assert pg.engine_buffers(vllm) < pg.engine_buffers(trt)


def test_a_static_batch_as_large_as_memory_holds_leaves_room_for_its_own_prefill(tmp_path):
    """IFB off: one context pass prefills the whole batch, so the buffers beside the pool grow with the batch;
    the batch fills the pool left beside them exactly, and is smaller than the in-flight one (whose buffers
    are one max_num_tokens step's)."""
    (row,) = pg.load_rows(write_csv(tmp_path / "s.csv", [
        _row(batch="max-throughput batch (TRT batch not stated)", model="meta-llama/Meta-Llama-3-8B",
             hw="A100-80GB", weight_dtype="fp16", kv_dtype="fp16", prompt="1024", gen="512")]))
    assert row.batch_kind == "max-static"
    profile = pe.make_profile("trtllm", dict(pe.prior_values(), runtime_reserve_gb=1.5))
    b = pg.static_max_batch(row, profile)
    m = load_model(row.model)
    buffers = b * (1024 * m.layer_activation_elems() * 2.0 + m.vocab_size * 4.0)
    assert b * (1024 + 512) == pytest.approx(pg._pool_tokens(row, profile, buffers=buffers), rel=1e-9)
    assert 100 < b < pg.steady_state_batch(row, profile)
    assert pg.predict_row(row, profile) == pytest.approx(
        pg._between(b, lambda n: pg._static(row, profile, n)), rel=1e-12)


def test_hf_flash_decode_never_gets_slower_with_less_cache():
    """The case hypothesis found: with K/V alone sizing the kernel, its fixed latency was charged again per
    byte of the queries and outputs, and H2O at 0.25 took longer than at 0.5 (hf, FP8, a 64-token prompt)."""
    kw = dict(batch=13, prompt=64, gen=2, kv_dtype="fp8", weight_dtype="fp8", profile="hf", with_capacity=False)
    small = engine.evaluate("h100-sxm", "mistral-7b-v0.1", "h2o", cache_ratio=0.25, **kw)["tpot_s"][0]
    large = engine.evaluate("h100-sxm", "mistral-7b-v0.1", "h2o", cache_ratio=0.5, **kw)["tpot_s"][0]
    assert small < large
