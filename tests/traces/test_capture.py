"""End-to-end capture on a tiny random model: files, invariants of the kept sets, retained mass, resume."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import traces
from traces.capture import store

from .conftest import MAX_NEW, POLICIES, RATIOS, tiny_config

pytest.importorskip("torch")


def test_capture_writes_a_complete_trace(tiny_trace_dir):
    trace = traces.load(tiny_trace_dir)
    m = trace.manifest
    assert m["schema_version"] == 1 and m["complete"] is True
    assert m["model"]["name"] == "tiny-llama" and m["model"]["trained"] is False
    assert m["model"]["n_layers"] == 2 and m["model"]["n_kv_heads"] == 2
    assert m["dataset"]["sample_ids"] == ["s0", "s1"] or sorted(m["dataset"]["sample_ids"]) == ["s0", "s1"]
    assert m["env"]["OMP_WAIT_POLICY"] is not None or "OMP_WAIT_POLICY" in m["env"]
    assert set(m["versions"]) >= {"torch", "transformers", "python"}
    runs = 2 * (1 + (len(POLICIES) - 1) * len(RATIOS))
    assert len(trace.texts) == runs
    assert len(trace.steps) == runs * MAX_NEW  # prefill + MAX_NEW - 1 decode steps
    assert len(trace.kv) == runs * MAX_NEW * 2 * 2  # x layers x kv heads
    assert set(trace.steps["phase"]) == {"prefill", "decode"}
    assert (trace.steps["wall_s"] > 0).all()
    assert not (tiny_trace_dir / store.SHARDS).exists()  # consolidated and cleaned up


def test_evicting_policies_hold_exactly_the_budget(tiny_trace_dir):
    kv = traces.load(tiny_trace_dir).kv
    evicting = kv[kv["policy"] != "full"]
    budget = np.maximum(1, np.floor(evicting["cache_ratio"].astype(float) * evicting["prompt_len"] + 1e-9))
    assert (evicting["kv_len"] == budget).all()
    full = kv[kv["policy"] == "full"]
    assert (full["kv_len"] == full["prompt_len"] + full["step"] + 1).all()


def test_retained_mass_is_one_at_full_cache_and_falls_with_the_ratio(tiny_trace_dir):
    kv = traces.load(tiny_trace_dir).kv
    full = kv[kv["policy"] == "full"]
    assert np.allclose(full["mass_retained"], 1.0, atol=1e-5)
    # At ratio 1.0 nothing is evicted at the prompt: the state after prefill keeps all the mass.
    prefill_at_one = kv[(kv["cache_ratio"] == 1.0) & (kv["step"] == -1)]
    assert np.allclose(prefill_at_one["mass_retained"], 1.0, atol=1e-5)
    assert ((kv["mass_retained"] >= -1e-6) & (kv["mass_retained"] <= 1 + 1e-5)).all()
    for policy in ("window", "h2o", "keyformer"):
        means = [kv[(kv["policy"] == policy) & np.isclose(kv["cache_ratio"], r)]["mass_retained"].mean()
                 for r in RATIOS]
        assert means[0] < means[1] < means[2], (policy, means)


def test_kept_positions_replay_matches_lengths_and_policy_rules(tiny_trace_dir):
    trace = traces.load(tiny_trace_dir)
    last = MAX_NEW - 2
    for sample in trace.samples:
        n = int(trace.kv.loc[trace.kv["sample"] == sample, "prompt_len"].iloc[0])
        k = math.floor(0.5 * n)
        window = trace.kept_positions(sample, "window", 0.5, last, layer=1, head=0)
        newest = n + last  # the token decode step `last` fed
        assert window.tolist() == list(range(newest - k + 1, newest + 1))
        streaming = trace.kept_positions(sample, "streaming", 0.5, last, layer=0, head=1)
        assert streaming[:4].tolist() == [0, 1, 2, 3] and len(streaming) == k
        h2o = trace.kept_positions(sample, "h2o", 0.5, last, layer=0, head=0)
        row = trace.kv[(trace.kv["sample"] == sample) & (trace.kv["policy"] == "h2o")
                       & np.isclose(trace.kv["cache_ratio"], 0.5) & (trace.kv["step"] == last)
                       & (trace.kv["layer"] == 0) & (trace.kv["head"] == 0)].iloc[0]
        assert len(h2o) == row["kv_len"] and int((h2o < n).sum()) == row["kept_prompt"]
        assert newest in h2o


def test_interrupted_capture_resumes_to_the_same_trace(tiny_trace_dir, tiny_dataset, tmp_path, monkeypatch):
    from traces.capture import run_capture

    out = tmp_path / "resumed"
    written = []
    real_write = store.write_shard

    def write_then_interrupt(folder, key, result):
        real_write(folder, key, result)
        written.append(key)
        if len(written) == 7:
            raise KeyboardInterrupt

    monkeypatch.setattr(store, "write_shard", write_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_capture(tiny_config(out, tiny_dataset))
    with pytest.raises(traces.TraceError, match="not finished"):
        traces.load(out)
    assert len(list((out / store.SHARDS).glob("*/text.json"))) == 7
    monkeypatch.setattr(store, "write_shard", real_write)
    run_capture(tiny_config(out, tiny_dataset))
    resumed, reference = traces.load(out), traces.load(tiny_trace_dir)
    assert resumed.kv.drop(columns="mass_retained").equals(reference.kv.drop(columns="mass_retained"))
    assert np.allclose(resumed.kv["mass_retained"], reference.kv["mass_retained"], atol=1e-6)
    keep = ["sample", "policy", "cache_ratio", "step", "token", "top1", "kv_len_mean"]
    assert resumed.steps[keep].equals(reference.steps[keep])
    assert resumed.texts["generated"].tolist() == reference.texts["generated"].tolist()
    assert resumed.kept.drop(columns="kept_bitmap").astype(str).equals(
        reference.kept.drop(columns="kept_bitmap").astype(str))


def test_two_parts_on_one_folder_write_the_single_worker_trace(tiny_trace_dir, tiny_dataset, tmp_path, capsys):
    """--part 1/2 then 2/2 (one worker per core, run at once in practice): the first leaves its batches'
    shards and no trace, the second finds every run done and writes the trace one worker writes."""
    from traces.capture import run_capture

    out = tmp_path / "parts"
    run_capture(tiny_config(out, tiny_dataset, part="1/2"))
    assert "runs of other parts still missing" in capsys.readouterr().err
    assert not (out / "manifest.json").exists()
    single = traces.load(tiny_trace_dir)
    first = single.manifest["dataset"]["sample_ids"][0]    # batch 0 (batch size 1): part 1's; batch 1: part 2's
    written = {p.parent.name.rsplit("__", 1)[-1] for p in (out / store.SHARDS).glob("*/text.json")}
    assert written == {first}
    run_capture(tiny_config(out, tiny_dataset, part="2/2"))
    parted = traces.load(out)
    assert parted.kv.drop(columns="mass_retained").equals(single.kv.drop(columns="mass_retained"))
    assert parted.texts["tokens"].map(tuple).tolist() == single.texts["tokens"].map(tuple).tolist()


@pytest.mark.parametrize("part", ["0/2", "3/2", "1", "a/b"])
def test_a_bad_part_is_refused(tiny_dataset, tmp_path, part):
    with pytest.raises(ValueError, match="part"):
        tiny_config(tmp_path / "x", tiny_dataset, part=part)


def test_changed_settings_do_not_mix_with_a_capture_in_progress(tiny_dataset, tmp_path, monkeypatch):
    from traces.capture import run_capture

    out = tmp_path / "t"

    def interrupt(folder, key, result):
        raise KeyboardInterrupt

    real_write = store.write_shard
    calls = []

    def write_once(folder, key, result):
        real_write(folder, key, result)
        calls.append(key)
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "write_shard", write_once)
    with pytest.raises(KeyboardInterrupt):
        run_capture(tiny_config(out, tiny_dataset, policies=["window"], cache_ratios=(0.5,)))
    with pytest.raises(ValueError, match="other settings"):
        run_capture(tiny_config(out, tiny_dataset, policies=["window"], cache_ratios=(0.25,)))


def test_teacher_forced_capture_feeds_the_reference(tiny_dataset, tmp_path):
    from traces.capture import run_capture
    from traces.models import byte_tokenizer

    out = run_capture(tiny_config(tmp_path / "tf", tiny_dataset, policies=["full", "window"],
                                  cache_ratios=(0.5,), teacher_forced=True, n=1))
    trace = traces.load(out)
    assert trace.manifest["dataset"]["mode"] == "teacher_forced"
    tokenizer = byte_tokenizer()
    sample = trace.texts.iloc[0]
    reference_ids = tokenizer(sample["reference"], add_special_tokens=False).input_ids[:MAX_NEW]
    for tokens in trace.texts["tokens"]:
        assert list(tokens) == reference_ids
    assert json.loads((out / "manifest.json").read_text())["capture"]["mode"] == "teacher_forced"


def test_batched_summary_capture_equals_the_per_sample_detailed_one(tmp_path, tiny_trace_dir, tiny_dataset):
    """Left-padded batches decode like single samples, Keyformer's noise included (each sample draws from its
    own stream: seed and sample id), and the summary rows are the detailed rows' means over layers and heads."""
    from traces.capture import run_capture

    out = run_capture(tiny_config(tmp_path / "batched", tiny_dataset, batch_size=2, detail="summary"))
    batched, single = traces.load(out), traces.load(tiny_trace_dir)
    assert batched.manifest["detail"] == "summary" and len(batched.kept) == 0
    assert set(batched.kv["layer"]) == {-1} and set(batched.kv["head"]) == {-1}
    # every policy, Keyformer's Gumbel noise included (a padded batch: tests/keyformer/test_released_code.py)
    noise_free = list(single.texts["policy"].unique())
    key = ["sample", "policy", "cache_ratio"]
    a = single.texts[single.texts["policy"].isin(noise_free)].set_index(key)["tokens"].map(tuple)
    b = batched.texts[batched.texts["policy"].isin(noise_free)].set_index(key)["tokens"].map(tuple)
    assert a.sort_index().equals(b.sort_index())
    means = single.kv.groupby(key + ["step"])["mass_retained"].mean()
    summary = batched.kv.set_index(key + ["step"])["mass_retained"]
    joined = summary.to_frame("summary").join(means.rename("detail"), how="inner")
    joined = joined[joined.index.get_level_values("policy").isin(noise_free)]
    assert len(joined) > 0 and np.allclose(joined["summary"], joined["detail"], atol=2e-4)
    steps_a = single.steps.set_index(key + ["step"])["nll"]
    steps_b = batched.steps.set_index(key + ["step"])["nll"]
    both = steps_a.to_frame("a").join(steps_b.rename("b"), how="inner")
    both = both[both.index.get_level_values("policy").isin(noise_free)]
    assert np.allclose(both["a"], both["b"], atol=1e-3)


def test_text_rows_record_the_rules_each_run_used(tiny_trace_dir):
    """Every run says the keyformer/ rule version it ran under; noise policies how their streams were seeded;
    the manifest's variant parameters say which beam-noise rule Keyformer used."""
    import keyformer

    trace = traces.load(tiny_trace_dir)
    texts = trace.texts
    assert (texts["rules_version"] == keyformer.RULES_VERSION).all()
    noisy = texts["policy"].str.startswith("keyformer")
    assert (texts.loc[noisy, "noise_stream"] == "seed/crc32(sample id)/replica").all()
    assert texts.loc[~noisy, "noise_stream"].isna().all()
    policy = trace.manifest["policy"]
    assert policy["variants"]["keyformer"]["params"]["beam_noise"] == "shared"
    assert policy["rules_version"] == keyformer.RULES_VERSION
    assert policy["variants"]["keyformer"]["rules"]["noise_stream"] == "seed/crc32(sample id)/replica"


def test_bundled_traces_say_they_ran_under_the_first_rules():
    """Trace folders captured before issue 26 carry rules_version 1 and, where a label's meaning moved, the
    rule they used: pyramidkv/adakv as the H2O-allocation variant (scoring=h2o), SnapKV's pooling over the
    window, Keyformer's per-prefill reseeding and official-mode rounding. The pre-registered experiment's
    traces (smollm2-135m/decisive-*) ran under the second rules and say so."""
    from kvcommon.variants import PolicyVariant

    second = 0
    for folder in traces.bundled():
        manifest = json.loads((traces.catalog().trace(folder) / "manifest.json").read_text())
        policy = manifest["policy"]
        if "/decisive-" in folder:
            assert policy.get("rules_version") == 2, folder
            assert all(v["rules"]["rules_version"] == 2 for label, v in policy["variants"].items()
                       if PolicyVariant.from_label(label).name == "keyformer"), folder
            second += 1
            continue
        assert policy.get("rules_version") == 1, folder
        for label, variant in policy["variants"].items():
            name = PolicyVariant.from_label(label).name
            if name in ("pyramidkv", "adakv"):
                assert variant["params"]["scoring"] == "h2o", (folder, label)
            if name in ("keyformer", "snapkv"):
                assert variant["rules"], (folder, label)
    assert second == 4          # decisive-cnndm, decisive-xsum-tf, the kept-position re-capture, Gemma's subset
