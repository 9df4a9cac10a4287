"""sim.parallel: sharding, collectives, the pipeline schedule and per-device capacity (physics checks)."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from hwmodels.platform import load_interconnect
from sim import engine, parallel
from sim.models import load_model

FIELDS = ["flops", "weight_bytes", "act_bytes", "kv_read_bytes", "kv_write_bytes"]


@pytest.fixture(scope="module")
def llama70():
    return load_model("llama-2-70b")


def test_tp1_pp1_is_the_single_device_prediction_exactly():
    args = ("h100-sxm", "llama-3-8b", 8, 2048, 128, "h2o", 0.3)
    p, e = parallel.predict(*args, profile="trtllm"), engine.predict(*args, profile="trtllm")
    assert p.summary() == e.summary()
    for mine, theirs in ((p.decode_ops, e.decode_ops), (p.prefill_ops, e.prefill_ops)):
        pd.testing.assert_frame_equal(mine.drop(columns="link_bytes"), theirs)
    assert p.extra["devices"] == 1 and p.extra["comm_decode_s"] == 0.0
    model = load_model("llama-3-8b")
    assert parallel.shard_model(model, 1, 1) is model


def test_shard_splits_heads_mlp_vocab_and_layers(llama70):
    s = parallel.shard_model(llama70, tp=4, pp=2)
    assert (s.n_heads, s.n_kv_heads, s.d_ff, s.n_layers) == (16, 2, 28672 // 4, 40)
    assert s.vocab_size == llama70.vocab_size // 4 and s.d_model == llama70.d_model and s.head_dim == llama70.head_dim
    # every weight of the model is on some device; only norms (and one vocabulary matrix per stage) repeat
    assert 4 * 2 * s.n_params() >= llama70.n_params()
    assert 4 * 2 * s.n_params() == pytest.approx(llama70.n_params(), rel=0.02)


def test_kv_heads_replicate_when_fewer_than_ranks(llama70):
    assert parallel.kv_heads_per_rank(8, 4) == 2 and parallel.kv_replication(8, 4) == 1.0
    assert parallel.kv_heads_per_rank(8, 16) == 1 and parallel.kv_replication(8, 16) == 2.0
    assert parallel.kv_heads_per_rank(1, 8) == 1 and parallel.kv_replication(1, 8) == 8.0    # MQA: every rank a copy
    s = parallel.shard_model(llama70, tp=16)
    assert s.n_kv_heads == 1 and s.n_heads == 4
    # KV per device per token: the model's / tp x replication
    per_device = s.kv_bytes_per_token("bf16")
    assert per_device == llama70.kv_bytes_per_token("bf16") / 16 * 2.0
    with pytest.raises(ValueError, match="multiple"):
        parallel.kv_heads_per_rank(8, 12)
    with pytest.raises(ValueError, match="divide"):
        parallel.kv_heads_per_rank(12, 8)


def test_stage_layers_cover_the_model_once():
    stages = parallel.stage_layers(80, 3)
    assert [len(r) for r in stages] == [27, 27, 26]
    assert [i for r in stages for i in r] == list(range(80))
    with pytest.raises(ValueError, match="exceeds"):
        parallel.stage_layers(4, 5)


def test_sliding_layers_follow_the_stage():
    m = load_model("mistral-7b-v0.1")
    if not m.sliding_window:
        pytest.skip("config without a sliding window")
    s = parallel.shard_model(m, pp=2)
    assert s.sliding_layers == tuple(range(s.n_layers)) and s.sliding_window == m.sliding_window


def test_bad_degrees_are_value_errors():
    for tp, pp in ((0, 1), (1, 0), (1.5, 1), (3, 1)):
        with pytest.raises(ValueError):
            parallel.shard_model("llama-2-7b", tp, pp)


def test_allreduce_bytes_formula():
    n = np.array([1e3, 1e6])
    for tp in (2, 4, 8):
        assert np.allclose(parallel.allreduce_link_bytes(n, tp), 2 * (tp - 1) / tp * n)
        assert np.allclose(parallel.allgather_link_bytes(n, tp), (tp - 1) / tp * n)
    assert np.all(parallel.allreduce_link_bytes(n, 1) == 0)


def test_allreduce_time_picks_the_faster_algorithm():
    link = load_interconnect("h100-sxm")
    big, small, tp = 1e9, 1e3, 8
    ring = lambda n: 2 * (tp - 1) * link.latency_s + 2 * (tp - 1) / tp * n / link.effective_bw
    doubling = lambda n: 3 * (link.latency_s + n / link.effective_bw)
    assert parallel.allreduce_time(link, big, tp) == pytest.approx(ring(big))       # bandwidth-bound: ring
    assert parallel.allreduce_time(link, small, tp) == pytest.approx(doubling(small))  # latency-bound: doubling
    assert parallel.allreduce_time(link, big, 1) == 0
    # never faster than the link allows
    assert parallel.allreduce_time(link, big, tp) >= 2 * (tp - 1) / tp * big / link.per_direction_bw


def test_collectives_per_layer_and_per_step(llama70):
    link = load_interconnect("h100-sxm")
    stage = parallel.shard_model(llama70, 4, 2)
    colls = {c.op.name: c for c in parallel.collectives(llama70, stage, 16, 4, 2, link, 2.0, 4e-6)}
    assert set(colls) == set(parallel.COMM_OPS)
    assert colls["tp_allreduce"].count == 2 * stage.n_layers
    assert colls["tp_allreduce"].link_bytes == pytest.approx(2 * stage.n_layers * 2 * 3 / 4 * 16 * 8192 * 2)
    assert colls["pp_send"].link_bytes == 16 * 8192 * 2
    assert parallel.collectives(llama70, llama70, 16, 1, 1, link, 2.0, 4e-6) == []


def test_no_interconnect_or_too_many_devices_is_refused():
    with pytest.raises(ValueError, match="no interconnect"):
        parallel.predict("cpu-local", "gpt2", 1, 64, 8, "full", 1.0, tp=2, weight_dtype="fp32", kv_dtype="fp32")
    with pytest.raises(ValueError, match="exceeds"):
        parallel.predict("h100-sxm", "llama-2-70b", 1, 64, 8, "full", 1.0, tp=8, pp=2)


def test_tensor_parallelism_cuts_memory_bound_decode_latency():
    one = parallel.predict("h100-sxm", "llama-2-13b", 1, 1024, 64, "full", 1.0)
    two = parallel.predict("h100-sxm", "llama-2-13b", 1, 1024, 64, "full", 1.0, tp=2)
    assert two.tpot_s < one.tpot_s
    # but not by more than the weights stream shrinks: the all-reduces and launches cost time
    assert two.tpot_s > one.tpot_s / 2
    assert two.extra["comm_decode_s"] > 0


def test_pipeline_bubble_at_batch_one():
    one = parallel.predict("h100-sxm", "llama-2-13b", 1, 1024, 64, "full", 1.0)
    pp2 = parallel.predict("h100-sxm", "llama-2-13b", 1, 1024, 64, "full", 1.0, pp=2)
    assert pp2.extra["bubble_factor"] == 2.0 and pp2.extra["micro_batches"] == 1
    assert pp2.tpot_s >= one.tpot_s          # one stage works at a time: no faster than one device
    full = parallel.predict("h100-sxm", "llama-2-13b", 8, 1024, 64, "full", 1.0, pp=2)
    assert full.extra["bubble_factor"] == 1.0 and full.extra["micro_batches"] == 2
    assert parallel.bubble_factor([1, 2, 4], 4).tolist() == [4.0, 2.0, 1.0]


def test_capacity_is_per_device_and_eviction_adds_requests(llama70):
    alone = parallel.predict("h100-sxm", llama70, 1, 4096, 256, "full", 1.0)
    assert not alone.extra["fits"] and alone.max_batch == 0
    tp2 = parallel.predict("h100-sxm", llama70, 1, 4096, 256, "full", 1.0, tp=2)
    tp4 = parallel.predict("h100-sxm", llama70, 1, 4096, 256, "full", 1.0, tp=4)
    assert tp2.extra["fits"] and tp4.max_batch > tp2.max_batch > 0
    assert tp4.peak_memory_bytes < tp2.peak_memory_bytes <= 80e9
    assert tp4.extra["weight_bytes_per_device"] == pytest.approx(llama70.weight_bytes() / 4, rel=0.01)
    evict = parallel.predict("h100-sxm", llama70, 1, 4096, 256, "h2o", 0.2, tp=4)
    assert evict.max_batch > tp4.max_batch


def test_deployment_tables_hold_the_whole_model():
    one = parallel.predict("h100-sxm", "llama-2-13b", 4, 1024, 64, "full", 1.0)
    two = parallel.predict("h100-sxm", "llama-2-13b", 4, 1024, 64, "full", 1.0, tp=2)
    mean = lambda p: p.decode_ops[(p.decode_ops.step == "mean") & ~p.decode_ops.op.isin(parallel.COMM_OPS)]
    for col in ("weight_bytes", "kv_read_bytes", "flops"):
        assert mean(two)[col].sum() == pytest.approx(mean(one)[col].sum(), rel=2e-3), col
    comm = two.decode_ops[(two.decode_ops.step == "mean") & two.decode_ops.op.isin(parallel.COMM_OPS)]
    assert set(comm.op) == {"tp_allreduce", "tp_embed_allreduce", "tp_logits_gather"} and (comm.link_bytes > 0).all()


def test_trace_override_is_cut_to_the_stage(llama70):
    gen = 8
    rows = np.tile(np.linspace(100, 179, llama70.n_layers), (gen + 1, 1))
    p = parallel.predict("h100-sxm", llama70, 1, 200, gen, "h2o", 0.5, kv_override=rows, tp=2, pp=2)
    assert p.tpot_s > 0
    with pytest.raises(ValueError, match="column per layer"):
        parallel.predict("h100-sxm", llama70, 1, 200, gen, "h2o", 0.5, kv_override=rows[:, :10], tp=2, pp=2)
