"""sim.parallel.timer: DES step times of a tp x pp deployment."""
import numpy as np
import pytest

from sim import engine
from sim.parallel import shard_model
from sim.parallel.timer import ParallelTimer

KW = dict(policy="full", cache_ratio=1.0, recent_ratio=0.3, weight_dtype="bf16", kv_dtype="bf16", profile="fused")
ENGINE_DECODE = dict(policy="full", recent_ratio=0.3, weight_dtype="bf16", kv_dtype="bf16", profile="fused")
ENGINE_PREFILL = dict(ENGINE_DECODE, cache_ratio=1.0)


def test_one_device_is_the_engine():
    t = ParallelTimer("h100-sxm", "llama-3-8b", **KW)
    kv, chunks = np.full(8, 1500.0), [(512, 0), (256, 512, True)]
    assert t.decode(kv) == engine.decode_step_time("h100-sxm", "llama-3-8b", kv, **ENGINE_DECODE)
    assert t.prefill(chunks) == engine.prefill_time("h100-sxm", "llama-3-8b", chunks, **ENGINE_PREFILL)
    assert t.mixed(kv, chunks) == engine.mixed_step_time("h100-sxm", "llama-3-8b", kv, chunks, **ENGINE_PREFILL)


def test_tensor_parallel_decode_sits_between_a_shard_and_one_device():
    kv = np.full(4, 1024.0)
    one = ParallelTimer("h100-sxm", "llama-2-13b", **KW).decode(kv)
    two = ParallelTimer("h100-sxm", "llama-2-13b", tp=2, **KW)
    shard_alone = engine.decode_step_time("h100-sxm", shard_model("llama-2-13b", 2), kv, **ENGINE_DECODE)
    assert shard_alone < two.decode(kv) < one
    assert two.model.n_heads == 20


def test_pipeline_cycle_is_max_of_micro_batches_and_stages():
    t = ParallelTimer("h100-sxm", "llama-2-13b", pp=2, **KW)
    host = t.setup.host_s
    kv = np.full(8, 1024.0)
    stage = engine.decode_step_time("h100-sxm", t.stage, kv[:4], **ENGINE_DECODE)
    comm = t._comm(4, [])
    assert t.decode(kv) == pytest.approx(2 * (stage - host + comm) + host)
    one = ParallelTimer("h100-sxm", "llama-2-13b", **KW).decode(kv[:1])
    assert t.decode(kv[:1]) >= one                         # one request: the stages take turns (bubble)


def test_no_interconnect_is_refused():
    with pytest.raises(ValueError, match="no interconnect"):
        ParallelTimer("cpu-local", "gpt2", tp=2, **{**KW, "weight_dtype": "fp32", "kv_dtype": "fp32"})
