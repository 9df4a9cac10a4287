"""sim.tradeoff: joining a trace's measured quality with predictions; Pareto fronts. Uses a small
synthetic trace folder written here in the reader's schema (no model, no torch)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim import tradeoff

traces = pytest.importorskip("traces")
schema = pytest.importorskip("traces.schema")

FIXTURE_RATIOS = (0.2, 0.5, 1.0)


def write_fixture_trace(folder: Path, *, prompt: int = 40, steps: int = 6, layers: int = 2, heads: int = 2,
                        samples: int = 2, ratios=FIXTURE_RATIOS, with_quality: bool = True,
                        model_name: str = "fixture-model", model_config: dict | None = None) -> Path:
    """A trace folder shaped like a real capture: full at ratio 1.0, h2o and keyformer at `ratios`.

    Kept length follows the policy (budget k = ratio * prompt); retained mass and ROUGE fall as the
    ratio falls, keyformer above h2o, so the expected joins and fronts are known."""
    folder.mkdir(parents=True, exist_ok=True)
    kv_rows, step_rows, text_rows, quality_rows = [], [], [], []
    variants = [("full", 1.0)] + [(p, r) for p in ("h2o", "keyformer") for r in ratios]
    for sample in range(samples):
        for policy, ratio in variants:
            budget = prompt if policy == "full" else int(ratio * prompt)
            for step in range(-1, steps):
                generated = step + 1
                context = prompt + generated
                kv_len = context if policy == "full" else min(context, budget)
                kept_prompt = max(kv_len - generated, 0) if policy != "full" else prompt
                for layer in range(layers):
                    for head in range(heads):
                        mass = 1.0 if policy == "full" else ratio ** (0.3 if policy == "keyformer" else 0.5)
                        kv_rows.append((str(sample), policy, ratio, step, layer, head, prompt, kv_len,
                                        kept_prompt, mass))
                step_rows.append((str(sample), policy, ratio, step, "prefill" if step < 0 else "decode", prompt,
                                  float(kv_len), kv_len * layers * heads * 2 * 8 * 2, 1e-3, -1, 0.0, 0.0, 1, 1,
                                  0.5))
            text_rows.append({"sample": str(sample), "policy": policy, "cache_ratio": ratio, "prompt_len": prompt,
                              "generated": "text", "reference": "text", "tokens": steps})
            rouge = 20.0 * (1.0 if policy == "full" else ratio ** (0.2 if policy == "keyformer" else 0.4))
            quality_rows.append({"policy": policy, "cache_ratio": ratio, "sample": str(sample),
                                 "rouge1": rouge + 10, "rouge2": rouge + sample, "rougeL": rouge + 5})
    kv = pa.Table.from_pylist([dict(zip(schema.KV_SCHEMA.names, r)) for r in kv_rows], schema=schema.KV_SCHEMA)
    pq.write_table(kv, folder / schema.KV)
    steps_table = pa.Table.from_pylist([dict(zip(schema.STEPS_SCHEMA.names, r)) for r in step_rows],
                                       schema=schema.STEPS_SCHEMA)
    pq.write_table(steps_table, folder / schema.STEPS)
    pq.write_table(schema.KEPT_SCHEMA.empty_table(), folder / schema.KEPT)
    (folder / schema.TEXTS).write_text("".join(json.dumps(r) + "\n" for r in text_rows))
    if with_quality:
        (folder / schema.QUALITY_DIR).mkdir(exist_ok=True)
        pd.DataFrame(quality_rows).to_csv(folder / schema.QUALITY_DIR / schema.QUALITY_CSV, index=False)
    manifest = {"schema_version": schema.SCHEMA_VERSION, "kind": schema.KIND,
                "model": {"name": model_name, "n_layers": layers,
                          "config": model_config or tiny_llama_config(layers, heads)}, "policy": {}, "dataset": {"name": "fixture"},
                "device": "cpu", "dtype": "fp32", "versions": {}, "seed": 0, "wall_time_s": 0.0,
                "created": "2026-01-01T00:00:00Z", "env": {}}
    (folder / schema.MANIFEST).write_text(json.dumps(manifest))
    return folder


def tiny_llama_config(layers: int, kv_heads: int) -> dict:
    """An HF config for the fixture trace's model (sim.models reads it like any config.json)."""
    return {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": layers, "num_attention_heads": 2 * kv_heads,
            "num_key_value_heads": kv_heads, "head_dim": 8, "intermediate_size": 128, "vocab_size": 256,
            "max_position_embeddings": 1024, "tie_word_embeddings": True}


@pytest.fixture
def fixture_trace(tmp_path):
    return write_fixture_trace(tmp_path / "fixture")


def test_measured_quality_has_one_row_per_policy_and_ratio(fixture_trace):
    q = tradeoff.measured_quality(traces.load(fixture_trace))
    assert len(q) == 1 + 2 * len(FIXTURE_RATIOS)
    assert set(q.columns) >= {"trace", "trace_model", "policy", "cache_ratio", "mass_retained", "rouge2"}
    assert (q["trace_model"] == "fixture-model").all()
    kf = q[q.policy == "keyformer"].set_index("cache_ratio")
    assert kf.loc[0.2, "mass_retained"] == pytest.approx(0.2 ** 0.3, rel=1e-6)
    assert kf.loc[0.5, "rouge2"] == pytest.approx(20 * 0.5 ** 0.2 + 0.5)  # mean over samples 0 and 1
    assert q.loc[q.policy == "full", "mass_retained"].item() == pytest.approx(1.0)


def test_quality_without_a_scored_trace_still_has_retained_mass(tmp_path):
    folder = write_fixture_trace(tmp_path / "unscored", with_quality=False)
    q = tradeoff.measured_quality(traces.load(folder))
    assert "rouge2" not in q.columns and q["mass_retained"].notna().all()
    assert tradeoff.quality_metric(q) == "mass_retained"


def test_join_matches_ratios_and_gives_full_its_single_measurement(fixture_trace):
    q = tradeoff.measured_quality(traces.load(fixture_trace), trace_name="fx")
    predictions = pd.DataFrame({
        "trace": "fx", "device": "h100",
        "policy": ["keyformer", "h2o", "full", "full", "keyformer"],
        "cache_ratio": np.array([0.2, 0.5, 0.2, 1.0, 0.3], dtype=np.float32).astype(float),  # float32 noise
        "tokens_per_s": [5.0, 4.0, 1.0, 1.0, 3.0]})
    joined = tradeoff.join_quality(predictions, q)
    assert len(joined) == len(predictions)
    assert list(joined["policy"]) == list(predictions["policy"])  # input order kept
    assert joined.loc[0, "mass_retained"] == pytest.approx(0.2 ** 0.3, rel=1e-6)
    assert joined.loc[2, "rouge2"] == joined.loc[3, "rouge2"] == pytest.approx(20.5)
    assert np.isnan(joined.loc[4, "rouge2"])  # 0.3 was never captured: no made-up quality


def test_trace_identity_changes_when_the_kv_table_changes(fixture_trace, tmp_path):
    before = tradeoff.trace_identity(fixture_trace)
    assert tradeoff.trace_identity(fixture_trace) == before
    other = write_fixture_trace(tmp_path / "other", prompt=48)
    assert tradeoff.trace_identity(other) != before
    with pytest.raises(FileNotFoundError, match="not a trace folder"):
        tradeoff.trace_identity(tmp_path)


def test_pareto_mask_keeps_exactly_the_undominated_points():
    x = np.array([1, 2, 3, 3, 4, np.nan, 0.5])
    y = np.array([5, 4, 4, 2, 1, 9, 5])
    # (2, 4) loses to (3, 4); (3, 2) to (3, 4); (0.5, 5) to (1, 5); NaN is never on the front
    assert tradeoff.pareto_mask(x, y).tolist() == [True, False, True, False, True, False, False]


def test_pareto_mask_agrees_with_brute_force_on_random_points():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 20, 300).astype(float), rng.integers(0, 20, 300).astype(float)
    mask = tradeoff.pareto_mask(x, y)
    for i in range(len(x)):
        dominated = np.any((x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i])))
        if dominated:
            assert not mask[i]
        else:  # undominated: on the front unless an identical point already represents it
            twins = np.flatnonzero((x == x[i]) & (y == y[i]))
            assert mask[twins].sum() == 1


def test_pareto_front_is_per_device_and_the_plot_is_written(tmp_path):
    frame = pd.DataFrame({"device": ["a", "a", "a", "b", "b"], "policy": ["full", "h2o", "keyformer", "full", "h2o"],
                          "tps": [1.0, 2.0, 1.5, 10.0, 5.0], "rouge2": [20.0, 15.0, 14.0, 20.0, 18.0]})
    front = tradeoff.pareto_front(frame, "tps", "rouge2", "device")
    assert front["pareto"].tolist() == [True, True, False, True, False]
    path = tradeoff.plot_pareto(frame, "tps", "rouge2", tmp_path / "fig" / "pareto.png") and tmp_path / "fig" / "pareto.png"
    assert path.stat().st_size > 5_000 and path.read_bytes()[:4] == b"\x89PNG"
    assert not list((tmp_path / "fig").glob("*.tmp"))
