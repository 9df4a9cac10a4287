"""Issue 27, items 3 and 9: one policy-variant grammar in sim.predict, sim.serve and sim.sweep (the keys are the
keyformer/ classes' parameters, read without torch); variant trace labels round-trip into --policy/--trace;
an evicting policy without --cache-ratio is an error in every sim CLI. Through the CLIs, as a user types them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim import policies
from sim.cli import run
from sim.predict import main as predict_main
from sim.serve import main as serve_main
from sim.sweep import main as sweep_main
from tests.helpers import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]
NOISE_TRACE = REPO / "traces" / "data" / "stories260k" / "tinystories-noise"
needs_noise_trace = pytest.mark.skipif(not (NOISE_TRACE / "manifest.json").is_file(),
                                       reason=f"bundled variant trace {NOISE_TRACE} not found")
PREDICT = ["--hw", "h200-sxm", "--model", "llama-2-7b", "--prompt", "1024", "--gen", "64"]
SERVE = ["--hw", "h200-sxm", "--model", "llama-2-7b", "--prompt", "512", "--gen", "16", "--requests", "4",
         "--no-progress"]


def predict_json(argv, capsys) -> dict:
    code = run(predict_main, PREDICT + argv + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def serve_json(argv, capsys) -> dict:
    code = serve_main(SERVE + argv + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_predict_takes_the_issue_variants(capsys):
    base = predict_json(["--policy", "keyformer", "--cache-ratio", "0.2"], capsys)
    official = predict_json(["--policy", "keyformer:selection=official", "--cache-ratio", "0.2"], capsys)
    # a selection-only variant: labelled, same KV as the base policy
    assert official["policy"] == "keyformer(selection=official)"
    assert official["max_batch"] == base["max_batch"] and official["peak_memory_bytes"] == base["peak_memory_bytes"]
    recent = predict_json(["--policy", "h2o:recent_ratio=0.2", "--cache-ratio", "0.2"], capsys)
    assert recent["policy"] == "h2o(recent_ratio=0.2)" and recent["recent_ratio"] == 0.2


def test_padded_budget_base_changes_the_budget(capsys):
    # k = floor(0.2 * max(1920, 1024)) = 384 tokens instead of floor(0.2 * 1024) = 204
    assert float(policies.get("keyformer(budget_base=padded)").budget(1024, 0.2)) == 384
    assert float(policies.get("keyformer:budget_base=padded,pad_length=512").budget(1024, 0.2)) == 204
    real = predict_json(["--policy", "keyformer", "--cache-ratio", "0.2"], capsys)
    padded = predict_json(["--policy", "keyformer:budget_base=padded", "--cache-ratio", "0.2"], capsys)
    assert padded["policy"] == "keyformer(budget_base=padded)"
    assert padded["max_batch"] < real["max_batch"]          # each request holds 385 tokens, not 205
    # a padded budget the request never reaches: the cache grows as full attention's does
    never = policies.get("keyformer(budget_base=padded)")
    assert float(never.peak_kv_tokens(512, 64, 0.9)) == 512 + 64
    assert float(never.kv_tokens(512, 10, 0.9)) == 522


@pytest.mark.parametrize("argv, fragment", [
    (["--policy", "keyformer:selection=bogus", "--cache-ratio", "0.5"],
     "policy keyformer: selection must be one of paper, official, got 'bogus'"),
    (["--policy", "keyformer:colour=red", "--cache-ratio", "0.5"],
     "policy keyformer has no parameter 'colour'; its parameters: "),
    (["--policy", "h2o:noise=none", "--cache-ratio", "0.5"], "policy h2o has no parameter 'noise'"),
    (["--policy", "h2o:cache_ratio=0.5"], "give it with --cache-ratio"),
    (["--policy", "keyformer:pad_length=long", "--cache-ratio", "0.5"], "pad_length must be an integer"),
    (["--policy", "h2o:recent_ratio=0.2", "--recent-ratio", "0.4", "--cache-ratio", "0.5"], "give one"),
    (["--policy", "h2o:recent_ratio=3", "--cache-ratio", "0.5"], "recent_ratio must be in [0, 1]"),
    (["--policy", "sparse:x=1"], "unknown policy 'sparse'"),
    (["--policy", "keyformer"], "--policy keyformer needs --cache-ratio"),
    (["--policy", "keyformer:selection=official"], "--policy keyformer needs --cache-ratio"),
])
def test_bad_variants_and_a_missing_cache_ratio_are_one_line(capsys, argv, fragment):
    for main, base in ((predict_main, PREDICT), (serve_main, SERVE)):
        code = run(main, base + argv)
        out, err = capsys.readouterr()
        assert_one_line_error(code, err, fragment, out=out)


def test_full_needs_no_cache_ratio(capsys):
    assert predict_json(["--policy", "full"], capsys)["cache_ratio"] == 1.0
    assert predict_json([], capsys)["policy"] == "full"
    assert serve_json(["--policy", "full"], capsys)["config"]["cache_ratio"] == 1.0


def test_serve_takes_variants(capsys):
    res = serve_json(["--policy", "h2o:recent_ratio=0.2", "--cache-ratio", "0.5"], capsys)
    assert res["config"]["policy"] == "h2o(recent_ratio=0.2)" and res["config"]["recent_ratio"] == 0.2
    padded = serve_json(["--policy", "keyformer:budget_base=padded", "--cache-ratio", "0.2"], capsys)
    real = serve_json(["--policy", "keyformer", "--cache-ratio", "0.2"], capsys)
    assert padded["mean_kv_bytes"] > real["mean_kv_bytes"]     # 385 tokens held per request, not 103


@needs_noise_trace
def test_trace_variant_labels_round_trip_into_predict_and_serve(capsys):
    import traces
    labels = [p for p in traces.load(NOISE_TRACE).policies if "(" in p]
    assert "keyformer(selection=official)" in labels
    for label in labels:     # the label as the trace names it into one CLI, as typed into the other
        typed = label.replace("(", ":").rstrip(")")      # keyformer(noise=none) -> keyformer:noise=none
        first, second = (label, typed) if label.endswith("official)") else (typed, label)
        got = predict_json(["--policy", first, "--cache-ratio", "0.5", "--trace", str(NOISE_TRACE)], capsys)
        assert got["policy"] == label and got["kv_source"] == "trace"
        served = serve_json(["--policy", second, "--cache-ratio", "0.5", "--trace", str(NOISE_TRACE)], capsys)
        assert served["config"]["policy"] == label and served["config"]["kv_source"] == "trace"


def test_sweep_policies_take_variants(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = run(sweep_main, ["--hw", "h200-sxm", "--models", "llama-2-7b", "--policies",
                            "full,keyformer:selection=official,h2o:recent_ratio=0.2,keyformer:budget_base=padded,"
                            "pad_length=4096", "--cache-ratios", "0.2,0.5", "--batches", "1", "--prompts", "1024",
                            "--gens", "64", "--recent-ratios", "0.3,0.4", "--traces", "none", "--no-plots",
                            "--no-cache", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    table = pd.read_parquet(out / "points.parquet")
    assert set(table["policy"]) == {"full", "keyformer(selection=official)", "h2o(recent_ratio=0.2)",
                                    "keyformer(budget_base=padded,pad_length=4096)"}
    h2o = table[table["policy"] == "h2o(recent_ratio=0.2)"]
    assert list(h2o["recent_ratio"]) == [0.2, 0.2]          # its own recent ratio, once per cache ratio
    one = table[table["cache_ratio"] == 0.2].groupby("policy")["max_batch"].first()
    assert one["keyformer(budget_base=padded,pad_length=4096)"] < one["keyformer(selection=official)"]


def test_sweep_rejects_a_bad_variant_in_one_line(capsys):
    code = run(sweep_main, ["--policies", "full,keyformer:selection=bogus", "--traces", "none", "--no-plots"])
    out, err = capsys.readouterr()
    assert_one_line_error(code, err, "grid policies: policy keyformer: selection must be one of paper, official")


@needs_noise_trace
@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_sweep_takes_a_trace_variant_by_its_label(tmp_path, capsys, engine):
    out = tmp_path / engine
    code = run(sweep_main, ["--hw", "h200-sxm", "--models", "llama-2-7b", "--policies",
                            "keyformer(selection=official)", "--cache-ratios", "0.5", "--batches", "1",
                            "--prompts", "512", "--gens", "16", "--traces", str(NOISE_TRACE), "--engine", engine,
                            "--requests", "4", "--no-plots", "--no-cache", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    traced = pd.read_parquet(out / "tradeoff.parquet")     # the trace-driven points
    assert set(traced["policy_label"]) == {"keyformer(selection=official)"} and len(traced) == 1
    if engine == "des":     # simulated under the variant's own trace rows (no longer left out)
        assert traced["des_error"].iloc[0] == "" and traced["completed"].iloc[0] == 4


def test_variants_need_no_torch():
    code = ("import sys; from sim import policies; policies.get('keyformer(selection=official)'); "
            "policies.get('h2o:recent_ratio=0.2').budget(10, 0.5); assert 'torch' not in sys.modules, 'torch'")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_bare_names_need_no_keyformer_source(monkeypatch):
    from sim.policies import variants

    def missing():
        raise ValueError("policy variants need the keyformer package's source (not found)")
    monkeypatch.setattr(variants, "keyformer_folder", missing)
    assert policies.label("h2o") == "h2o" and variants.resolve("keyformer", policies.NAMES)[1] == 0.3
    with pytest.raises(ValueError, match="keyformer package's source"):
        variants.read_variant("keyformer:selection=official", policies.NAMES)
