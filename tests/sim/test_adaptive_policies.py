"""sim.policies' adaptive budgets (mass, pyramidkv, adakv): lengths from traces, ragged or padded kernels.

A synthetic trace (per-head lengths a real capture of each policy has the shape of) drives predictions for
the trace's own model at its own lengths, where the trace maps onto the target one to one: the prediction
equals the arithmetic over the trace's kv table, and differs from the formula where the data says so."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim import engine, kvlen, policies
from sim.models import spec_from_config
from sim.policies.pyramidkv import pyramid_budgets

traces = pytest.importorskip("traces")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from traces import schema  # noqa: E402

PROMPT, STEPS, LAYERS, HEADS, SAMPLES, RATIO = 40, 6, 2, 2, 3, 0.5
K, W = 20, 6                                   # floor(0.5 * 40), floor(0.3 * 20)
GEN = STEPS                                    # rows -1..STEPS-1: gen + 1 rows, the trace's own length
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": LAYERS, "num_attention_heads": 2 * HEADS,
          "num_key_value_heads": HEADS, "head_dim": 8, "intermediate_size": 128, "vocab_size": 256,
          "max_position_embeddings": 1024, "tie_word_embeddings": True}
MODEL = spec_from_config(CONFIG, "adaptive-fixture")


def head_length(policy: str, sample: int, step: int, layer: int, head: int) -> int:
    """What each policy's capture looks like: mass below k and varying, adakv's heads trading tokens at a
    constant layer total 2k, pyramidkv its schedule (the same on every head)."""
    if policy == "mass":
        return K - (sample + 2 * layer + 3 * head + step + 1) % 7
    if policy == "adakv":
        d = (sample + layer + step + 1) % 4 + 1
        return K - d if head == 0 else K + d
    return int(pyramid_budgets(K, W, PROMPT, LAYERS)[layer])


def write_trace(folder: Path) -> Path:
    folder.mkdir(parents=True)
    kv, steps, texts = [], [], []
    for sample in range(SAMPLES):
        for policy in policies.ADAPTIVE:
            for step in range(-1, STEPS):
                lengths = []
                for layer in range(LAYERS):
                    for head in range(HEADS):
                        n_kv = head_length(policy, sample, step, layer, head)
                        lengths.append(n_kv)
                        kv.append((str(sample), policy, RATIO, step, layer, head, PROMPT, n_kv, n_kv - (step + 1),
                                   0.9))
                steps.append((str(sample), policy, RATIO, step, "prefill" if step < 0 else "decode", PROMPT,
                              float(np.mean(lengths)), 0, 1e-3, -1, 0.0, 0.0, 1, 1, 0.5))
            texts.append({"sample": str(sample), "policy": policy, "cache_ratio": RATIO, "prompt_len": PROMPT,
                          "generated": "", "reference": "", "tokens": STEPS})
    table = lambda rows, sch: pa.Table.from_pylist([dict(zip(sch.names, r)) for r in rows], schema=sch)
    pq.write_table(table(kv, schema.KV_SCHEMA), folder / schema.KV)
    pq.write_table(table(steps, schema.STEPS_SCHEMA), folder / schema.STEPS)
    pq.write_table(schema.KEPT_SCHEMA.empty_table(), folder / schema.KEPT)
    (folder / schema.TEXTS).write_text("".join(json.dumps(t) + "\n" for t in texts))
    (folder / schema.MANIFEST).write_text(json.dumps({
        "schema_version": schema.SCHEMA_VERSION, "kind": schema.KIND, "model": {"name": "adaptive-fixture",
        "n_layers": LAYERS, "config": CONFIG}, "policy": {}, "dataset": {"name": "fixture"}, "device": "cpu",
        "dtype": "fp32", "versions": {}, "seed": 0, "wall_time_s": 0.0, "created": "2026-01-01T00:00:00Z", "env": {}}))
    return folder


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return traces.load(write_trace(tmp_path_factory.mktemp("adaptive") / "trace"))


def by_hand(trace, policy: str, heads: str) -> np.ndarray:
    """(steps, layers): each sample's layer length (mean or fullest head), averaged over samples."""
    kv = trace.kv[trace.kv.policy == policy]
    per_sample = kv.groupby(["sample", "step", "layer"])["kv_len"].agg(heads)
    return per_sample.groupby(["step", "layer"]).mean().unstack("layer").to_numpy(float)


def kernel(name: str, attn_kernel: str):
    return policies.get(name).with_attn_kernel(attn_kernel)


def test_the_adaptive_policies_and_their_kernels():
    assert policies.ADAPTIVE == ("mass", "pyramidkv", "adakv") and policies.ATTN_KERNELS == ("ragged", "padded")
    for name in policies.ADAPTIVE:
        p = policies.get(name)
        assert p.attn_kernel == "ragged" and p.trace_heads == "mean" and p.scored and p.evicts
        assert kernel(name, "padded").trace_heads == "max" and kernel(name, "padded").name == name
        with pytest.raises(ValueError, match="attn_kernel"):
            p.with_attn_kernel("dense")
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.attn_kernel = "padded"
        # the formula: k per head (mass: its cap; adakv: the layer mean; pyramidkv: the layer mean)
        assert p.kv_tokens(1000, 5, 0.2) == policies.get("h2o").kv_tokens(1000, 5, 0.2) == 200


def test_pyramid_schedule_is_keyformers():
    torch = pytest.importorskip("torch")
    from keyformer.pyramidkv import pyramid_budgets as torch_budgets
    for k, w, ceiling, layers in ((20, 6, 40, 2), (100, 30, 1000, 32), (30, 9, 40, 4), (613, 183, 2048, 30),
                                  (7, 2, 14, 12), (50, 15, 1000, 1)):
        ours = pyramid_budgets(k, w, ceiling, layers)
        theirs = torch_budgets(torch.tensor([k]), torch.tensor([w]), torch.tensor([ceiling]), layers)[0]
        assert ours.tolist() == theirs.tolist()
        assert ours.sum() == k * layers


def test_pyramidkv_formula_is_the_per_layer_schedule():
    m = MODEL
    lengths = policies.get("pyramidkv").formula_lengths(PROMPT, GEN, RATIO, m)
    assert lengths.shape == (GEN + 1, LAYERS)
    assert (lengths == [34.0, 6.0]).all() and lengths.mean(axis=1).tolist() == [K] * (GEN + 1)
    flat = policies.get("mass").formula_lengths(PROMPT, GEN, RATIO, m)
    assert (flat == K).all() and (policies.get("adakv").formula_lengths(PROMPT, GEN, RATIO, m) == K).all()


@pytest.mark.parametrize("attn_kernel", ["ragged", "padded"])
@pytest.mark.parametrize("name", ["mass", "pyramidkv", "adakv"])
def test_trace_driven_lengths_are_the_trace_arithmetic(trace, name, attn_kernel):
    p = kernel(name, attn_kernel)
    lengths = p.trace_lengths(trace, RATIO, PROMPT, GEN, MODEL)
    expected = by_hand(trace, name, "mean" if attn_kernel == "ragged" else "max")
    np.testing.assert_allclose(lengths, expected, rtol=1e-12)
    per_sample, ids = p.trace_lengths_per_sample(trace, RATIO, PROMPT, GEN, MODEL)
    assert ids == ["0", "1", "2"] and per_sample.shape == (SAMPLES, GEN + 1, LAYERS)
    np.testing.assert_allclose(per_sample.mean(axis=0), lengths, rtol=1e-12)


@pytest.mark.parametrize("attn_kernel", ["ragged", "padded"])
@pytest.mark.parametrize("name", ["mass", "pyramidkv", "adakv"])
def test_trace_driven_prediction_equals_the_arithmetic_and_differs_where_the_data_does(trace, name, attn_kernel):
    """decode KV bytes read and peak KV tokens from the trace by hand; against the formula: mass holds less
    than k (both kernels), adakv's padded heads more (its ragged mean is k, the formula's), pyramidkv's trace
    is its schedule (no difference: the data cannot change a length that depends only on n, k and L)."""
    p = kernel(name, attn_kernel)
    lengths = p.trace_lengths(trace, RATIO, PROMPT, GEN, MODEL)
    batch, kvb = 4, 2.0
    traced = engine.predict("h100-sxm", MODEL, batch, PROMPT, GEN, name, RATIO, kv_override=lengths)
    formula = engine.predict("h100-sxm", MODEL, batch, PROMPT, GEN, name, RATIO)
    assert traced.inputs["kv_source"] == "trace" and formula.inputs["kv_source"] == "formula"
    hand = by_hand(trace, name, "mean" if attn_kernel == "ragged" else "max")
    decode_rows = hand[: GEN - 1]                                   # decode steps 0 .. gen-2 read rows 0 .. gen-2
    per_token = 2 * MODEL.n_kv_heads * MODEL.head_dim * kvb         # K and V of one token on one layer
    read = batch * per_token * decode_rows.sum(axis=1).mean()
    assert traced.extra["decode_kv_read_bytes"] == pytest.approx(read, rel=1e-9)
    assert traced.extra["peak_kv_tokens"] == pytest.approx(max(PROMPT, hand.mean(axis=1).max() + 1.0), rel=1e-12)
    assert formula.extra["decode_kv_read_bytes"] == pytest.approx(batch * per_token * LAYERS * K, rel=1e-9)
    schedule = engine.predict("h100-sxm", MODEL, batch, PROMPT, GEN, name, RATIO,
                              kv_override=p.formula_lengths(PROMPT, GEN, RATIO, MODEL))
    assert schedule.extra["decode_kv_read_bytes"] == pytest.approx(formula.extra["decode_kv_read_bytes"], rel=1e-9)
    differs = name == "mass" or (name == "adakv" and attn_kernel == "padded")
    if differs:
        assert traced.extra["decode_kv_read_bytes"] != pytest.approx(formula.extra["decode_kv_read_bytes"], rel=1e-6)
        assert traced.tpot_s != pytest.approx(formula.tpot_s, rel=1e-9)
        faster = name == "mass"
        assert (traced.tpot_s < formula.tpot_s) == faster
        assert traced.max_batch >= formula.max_batch if faster else traced.max_batch <= formula.max_batch
    else:
        assert traced.extra["decode_kv_read_bytes"] == pytest.approx(formula.extra["decode_kv_read_bytes"], rel=1e-9)


def test_padded_costs_at_least_ragged(trace):
    for name in policies.ADAPTIVE:
        ragged = kernel(name, "ragged").trace_lengths(trace, RATIO, PROMPT, GEN, MODEL)
        padded = kernel(name, "padded").trace_lengths(trace, RATIO, PROMPT, GEN, MODEL)
        assert (padded >= ragged - 1e-9).all()
        assert (padded > ragged + 0.5).any() == (name != "pyramidkv")


def test_des_requests_replay_the_trace_per_sample(trace):
    """The DES's per-request lengths (sim.des.analytic.TraceKV, heads from the policy's kernel): requests
    replay different samples, each the layer mean of its own per-layer lengths."""
    from sim.des.analytic import TraceKV
    for attn_kernel in ("ragged", "padded"):
        p = kernel("mass", attn_kernel)
        kv = TraceKV(trace, "mass", RATIO, LAYERS, heads=p.trace_heads, model=MODEL)
        per_sample, _ = p.trace_lengths_per_sample(trace, RATIO, PROMPT, GEN, MODEL)
        requests = [kv.decode_kv(i, PROMPT, GEN) for i in range(SAMPLES)]
        for i, got in enumerate(requests):
            np.testing.assert_allclose(got, per_sample[i].mean(axis=1), rtol=1e-12)
        assert not np.allclose(requests[0], requests[1])
    assert kvlen.SCORED[-3:] == policies.ADAPTIVE
