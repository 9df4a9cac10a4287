"""traces.load and Trace.kv_override on hand-built trace folders (no torch, no model)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import traces
from traces import schema


def _table(rows: list[dict], table_schema: pa.Schema) -> pa.Table:
    frame = pd.DataFrame(rows, columns=[f.name for f in table_schema])
    return pa.Table.from_pandas(frame, schema=table_schema, preserve_index=False)


def write_trace(folder, *, prompt=100, gen=11, layers=4, heads=2, budget_by_layer=(50, 50, 30, 30),
                policy="h2o", ratio=0.5):
    """A consistent trace: `full` grows, `policy` holds budget_by_layer[l] tokens per head."""
    folder.mkdir(parents=True, exist_ok=True)
    kv, kept, steps, texts = [], [], [], []
    for name, r in (("full", 1.0), (policy, ratio)):
        for sample in ("a", "b"):
            for step in range(-1, gen - 1):
                context = prompt + step + 1
                for layer in range(layers):
                    for head in range(heads):
                        held = context if name == "full" else budget_by_layer[layer] + (head if sample == "b" else 0)
                        generated_held = min(step + 1, held)
                        kv.append({"sample": sample, "policy": name, "cache_ratio": r, "step": step, "layer": layer, "head": head,
                                       "prompt_len": prompt, "kv_len": held, "kept_prompt": held - generated_held,
                                       "mass_retained": 1.0 if name == "full" else 0.8})
                        kept.append({"sample": sample, "policy": name, "cache_ratio": r, "step": step, "layer": layer, "head": head,
                                         "kept_bitmap": np.packbits(np.ones(prompt, np.uint8)).tobytes() if step == -1 else None,
                                         "added": [] if step == -1 else [prompt + step], "evicted": []})
                steps.append({"sample": sample, "policy": name, "cache_ratio": r, "step": step,
                                  "phase": "prefill" if step == -1 else "decode", "prompt_len": prompt,
                                  "kv_len_mean": 1.0, "kv_cache_bytes": 1, "wall_s": 0.01, "peak_mem_bytes": -1, "score_flops": 0.0,
                                  "score_elems": 0.0, "token": 5, "top1": 5, "nll": 1.0})
            texts.append({"sample": sample, "policy": name, "cache_ratio": r, "prompt_len": prompt, "generated": "x",
                              "reference": "y", "tokens": [5] * gen})
    pq.write_table(_table(kv, schema.KV_SCHEMA), folder / schema.KV)
    pq.write_table(_table(kept, schema.KEPT_SCHEMA), folder / schema.KEPT)
    pq.write_table(_table(steps, schema.STEPS_SCHEMA), folder / schema.STEPS)
    (folder / schema.TEXTS).write_text("".join(json.dumps(t) + "\n" for t in texts))
    manifest = {"schema_version": 1, "kind": schema.KIND, "complete": True,
                "model": {"name": "hand-made", "n_layers": layers, "n_kv_heads": heads},
                "dataset": {"name": "none", "mode": "generate"},
                "rows": {schema.KV: len(kv), schema.KEPT: len(kept), schema.STEPS: len(steps), schema.TEXTS: len(texts)}}
    (folder / schema.MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def trace_dir(tmp_path):
    return write_trace(tmp_path / "trace")


def test_round_trip(trace_dir):
    trace = traces.load(trace_dir)
    assert trace.policies == ["full", "h2o"]
    assert trace.cache_ratios("h2o") == [0.5]
    assert trace.samples == ["a", "b"]
    assert len(trace.kv) == 2 * 2 * 11 * 4 * 2
    assert trace.quality is None
    assert trace.kept_positions("a", "h2o", 0.5, 3, 0, 0).tolist() == list(range(100)) + [100, 101, 102, 103]
    summary = trace.summary().set_index("policy")
    assert summary.loc["full", "kept_fraction"] == pytest.approx(1.0)
    assert summary.loc["h2o", "mass_retained"] == pytest.approx(0.8)


def test_full_cache_override_grows_with_the_target_lengths(trace_dir):
    trace = traces.load(trace_dir)
    # Any target prompt/generation: the full cache holds prompt + r tokens at row r, every layer.
    out = trace.kv_override("full", 0.3, prompt=1000, gen=200, n_layers=32)
    assert out.shape == (201, 32)
    assert np.allclose(out, (1000 + np.arange(201))[:, None])


def test_budget_policy_scales_with_the_prompt_and_maps_depth(trace_dir):
    trace = traces.load(trace_dir)
    out = trace.kv_override("h2o", 0.5, prompt=1000, gen=500, n_layers=7, sample="a")
    # Trace layers hold 50, 50, 30, 30 of 100 prompt tokens: the budget is 50% then 30% of the prompt,
    # interpolated linearly by relative depth (layer j of 7 -> trace position j/6 * 3).
    depth = np.linspace(0, 3, 7)
    expected = np.interp(depth, [0, 1, 2, 3], [500, 500, 300, 300])
    assert np.allclose(out[0], expected)
    assert np.allclose(out[-1], expected)  # constant during decoding, however long it is


def test_heads_and_samples(trace_dir):
    trace = traces.load(trace_dir)
    mean_b = trace.kv_override("h2o", 0.5, prompt=100, gen=10, n_layers=4, sample="b")
    max_b = trace.kv_override("h2o", 0.5, prompt=100, gen=10, n_layers=4, sample="b", heads="max")
    assert np.allclose(mean_b[0], [50.5, 50.5, 30.5, 30.5])  # heads hold budget and budget + 1
    assert np.allclose(max_b[0], [51, 51, 31, 31])
    both = trace.kv_override("h2o", 0.5, prompt=100, gen=10, n_layers=4)
    per_sample, ids = trace.kv_override_per_sample("h2o", 0.5, prompt=100, gen=10, n_layers=4)
    assert ids == ["a", "b"] and per_sample.shape == (2, 11, 4)
    assert np.allclose(both, per_sample.mean(axis=0))


def test_kv_override_rejects_what_the_trace_lacks(trace_dir):
    trace = traces.load(trace_dir)
    with pytest.raises(ValueError, match="policy 'keyformer' not in trace"):
        trace.kv_override("keyformer", 0.5, 100, 10, 4)
    with pytest.raises(ValueError, match="cache ratio 0.2 not captured"):
        trace.kv_override("h2o", 0.2, 100, 10, 4)
    with pytest.raises(ValueError, match="sample 'zz'"):
        trace.kv_override("h2o", 0.5, 100, 10, 4, sample="zz")
    with pytest.raises(ValueError, match="heads"):
        trace.kv_override("h2o", 0.5, 100, 10, 4, heads="median")


def test_bundled_traces_are_listed_and_load():
    names = traces.bundled()
    for name in names:
        trace = traces.load(traces.bundled(name))
        assert trace.manifest["model"]["name"]
    with pytest.raises(FileNotFoundError, match="no bundled trace"):
        traces.bundled("no-such-trace")


# ---- broken folders: one TraceError line naming the file -------------------------------------------------
def _one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_missing_folder_and_manifest(tmp_path):
    with pytest.raises(traces.TraceError, match="no such trace folder"):
        traces.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(traces.TraceError, match="manifest.json: missing") as exc:
        traces.load(tmp_path / "empty")
    _one_line(exc)


def test_corrupt_manifest(trace_dir):
    (trace_dir / schema.MANIFEST).write_text('{"schema_version": 1, "kind": ')
    with pytest.raises(traces.TraceError, match="manifest.json: not valid JSON") as exc:
        traces.load(trace_dir)
    _one_line(exc)


def test_newer_schema_version_is_refused(trace_dir):
    manifest = json.loads((trace_dir / schema.MANIFEST).read_text())
    manifest["schema_version"] = 99
    (trace_dir / schema.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(traces.TraceError, match="schema_version 99 is newer"):
        traces.load(trace_dir)


@pytest.mark.parametrize("name", [schema.KV, schema.STEPS])
def test_truncated_parquet(trace_dir, name):
    path = trace_dir / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(traces.TraceError, match=f"{name}: corrupt or truncated") as exc:
        traces.load(trace_dir)
    _one_line(exc)


def test_parquet_with_fewer_rows_than_the_manifest(trace_dir):
    table = pq.read_table(trace_dir / schema.KV)
    pq.write_table(table.slice(0, table.num_rows - 5), trace_dir / schema.KV)
    with pytest.raises(traces.TraceError, match=r"kv.parquet: \d+ rows, manifest says \d+ \(truncated\?\)"):
        traces.load(trace_dir)


def test_missing_file_and_missing_column(trace_dir):
    (trace_dir / schema.STEPS).unlink()
    with pytest.raises(traces.TraceError, match="steps.parquet: missing"):
        traces.load(trace_dir)
    write_trace(trace_dir)
    table = pq.read_table(trace_dir / schema.KV).drop(["mass_retained"])
    pq.write_table(table, trace_dir / schema.KV)
    with pytest.raises(traces.TraceError, match="kv.parquet: missing columns mass_retained"):
        traces.load(trace_dir)


def test_truncated_texts(trace_dir):
    path = trace_dir / schema.TEXTS
    path.write_text(path.read_text()[:-20])
    with pytest.raises(traces.TraceError, match=r"texts.jsonl: line \d+ is not valid JSON"):
        traces.load(trace_dir)


def test_truncated_kept_is_reported_when_used(trace_dir):
    path = trace_dir / schema.KEPT
    path.write_bytes(path.read_bytes()[:100])
    trace = traces.load(trace_dir)  # kv/steps/texts are fine: kept positions load on first use
    with pytest.raises(traces.TraceError, match="kept.parquet: corrupt or truncated"):
        _ = trace.kept
    assert not math.isnan(trace.kv["mass_retained"].mean())


def test_content_hash_is_a_property_of_the_trace_and_follows_the_kv_table(trace_dir, tmp_path):
    import shutil

    from traces.reader import content_hash
    trace = traces.load(trace_dir)
    assert trace.content_hash == content_hash(trace_dir) and len(trace.content_hash) == 16
    other = tmp_path / "other"
    shutil.copytree(trace_dir, other)
    assert content_hash(other) == trace.content_hash     # the bytes, not the path
    table = pq.read_table(other / schema.KV)
    pq.write_table(table.slice(0, table.num_rows - 1), other / schema.KV)
    assert content_hash(other) != trace.content_hash
    with pytest.raises(FileNotFoundError, match="missing"):
        content_hash(tmp_path)


def test_catalog_lists_each_kind_once():
    cat = traces.catalog()
    assert cat.traces and cat.timing and cat.quality_reports
    assert not set(cat.traces) & set(cat.timing)
    assert all(traces.reader._read_manifest(p)["kind"] == schema.KIND for p in cat.traces)
    assert [cat.name(p) for p in cat.traces] == traces.bundled()
    assert cat.trace(traces.bundled()[0]) == cat.root / traces.bundled()[0]
    assert cat.root / "quality" / "quality.csv" in cat.quality_reports
    with pytest.raises(FileNotFoundError, match="no bundled trace"):
        cat.trace("nope")


def test_catalog_of_another_root(tmp_path, trace_dir):
    import shutil
    root = tmp_path / "root"
    shutil.copytree(trace_dir, root / "m" / "d")
    (root / "x").mkdir()
    (root / "x" / "manifest.json").write_text("{")       # unreadable: skipped
    cat = traces.catalog(root)
    assert cat.traces == (root / "m" / "d",) and cat.timing == () and cat.name(cat.traces[0]) == "m/d"
