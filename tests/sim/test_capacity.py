"""Capacity (sim.capacity): the steady state of continuous batching and the all-at-once batch, against
the memory they model and against the DES (sim.serve) at --qps inf under the matching admission mode."""
import math

import numpy as np
import pytest

from sim import capacity, engine, kvlen
from sim.profiles import get_profile
from sim.des.metrics import steady_window
from sim.serve import simulate
from tests.sim.conftest import real_device_names

SHIPPED = set(real_device_names())
needs = lambda *names: pytest.mark.skipif(not set(names) <= SHIPPED, reason=f"devices {names} not shipped")

# the DES's prefill step as the analytic model assumes it: one prefill chunk of the profile (fused: 8192)
STEP = get_profile("fused").prefill_chunk_tokens


@needs("h200-sxm")
def test_steady_state_capacity_at_the_issue_point():
    """Llama-2-7B, 4096 + 4096 on an H200 (141 GiB): all at once 31 (full) and 63 (Keyformer at any ratio:
    the prefill holds the whole prompt; the issue's 29 and 58 read the capacity as 141e9 bytes); in the
    steady state each request counts at what it holds over its life."""
    p = {name: engine.predict("h200-sxm", "llama-2-7b", 1, 4096, 4096, policy, ratio)
         for name, policy, ratio in (("full", "full", 1.0), ("k5", "keyformer", 0.5), ("k2", "keyformer", 0.2))}
    assert [p[k].max_batch_all_at_once for k in ("full", "k5", "k2")] == [31, 63, 63]
    assert p["full"].max_batch > 31 and p["k2"].max_batch > p["k5"].max_batch > 63
    # the DES at --qps inf (paged, 400 requests, sim.des.metrics.steady_window; 2026-12-01) sustains 41.7
    # (full) and 118.8 (keyformer 0.5; 122.8 with --chunked-prefill 8192) requests in flight, and holds at
    # most 63 and 123 at once (its 16-token blocks and 1% watermark)
    assert p["full"].max_batch == pytest.approx(41.7, rel=0.05) and p["k5"].max_batch == pytest.approx(122.8, rel=0.05)
    assert p["k2"].max_batch_tokens_per_s > p["k5"].max_batch_tokens_per_s > p["full"].max_batch_tokens_per_s


@pytest.mark.parametrize("policy,ratio", [("full", 1.0), ("keyformer", 0.5), ("streaming", 0.2)])
def test_steady_max_batch_fits_and_one_more_does_not(toy_device, policy, ratio):
    s = engine.make_setup(toy_device, "llama-3-8b", policy)
    n, gen = np.array([4096.0]), np.array([1024.0])
    held = kvlen.steady_kv_tokens(policy, n, gen, ratio)
    peak = kvlen.peak_kv_tokens(policy, n, gen, ratio)
    mb = engine.max_batch(toy_device, "llama-3-8b", 4096, 1024, policy=policy, cache_ratio=ratio)
    mem = lambda b: capacity.steady_memory(s, np.array([float(b)]), np.ones(1), n, gen, n, held)[0]
    assert mem(mb) <= toy_device.memory_bytes < mem(mb + 1)
    # every request holds its prompt for its one prefill step (4096 <= one 8192-token chunk) and what it
    # keeps for its 1023 decode steps: a life of 1024 steps
    life = (4096 + 1023 * held[0]) / 1024
    assert capacity.life_tokens(s, n, gen, n, held)[0] == pytest.approx(life)
    kv_token = s.model.kv_bytes_per_token("bf16") + (s.model.n_layers * s.model.n_kv_heads * 4 if policy in kvlen.SCORED else 0)
    logits = s.model.vocab_size * 4                                     # one more row of fp32 logits
    assert mem(mb + 1) - mem(mb) == pytest.approx(life * kv_token + logits, rel=1e-9)
    assert held[0] == (4096 + 512 if policy == "full" else math.floor(ratio * 4096) + 1)
    assert mb >= engine.max_batch_all_at_once(toy_device, "llama-3-8b", 4096, 1024, policy=policy,
                                              cache_ratio=ratio) > 0
    assert peak[0] >= held[0]


def test_static_batch_stacks_get_the_all_at_once_answer(toy_device):
    # hf-eager prefills the whole batch at once (no prefill chunking, no continuous batching)
    kw = dict(policy="keyformer", cache_ratio=0.2, profile="hf-eager")
    assert (engine.max_batch(toy_device, "gpt2", 1024, 256, **kw)
            == engine.max_batch_all_at_once(toy_device, "gpt2", 1024, 256, **kw))
    r = engine.evaluate(toy_device, "gpt2", "keyformer", batch=1, prompt=1024, gen=256, cache_ratio=0.2,
                        profile="hf-eager")
    assert r["max_batch_tokens_per_s"][0] == pytest.approx(r["max_batch_all_at_once_tokens_per_s"][0])


def _agreement(hw, model, policy, ratio, prompt, gen, admission):
    """(analytic tokens/s at the batch that admission mode sustains, the DES's over its steady window)."""
    r = engine.evaluate(hw, model, policy, batch=1, prompt=prompt, gen=gen, cache_ratio=ratio)
    key = "max_batch" if admission == "paged" else "max_batch_all_at_once"
    batch, analytic = int(r[key][0]), float(r[key + "_tokens_per_s"][0])
    # enough requests for six full batches; the steady window leaves out the ramp-up and the drain
    des = simulate(hw, model, policy, ratio, qps=math.inf, requests=6 * batch, prompt=prompt, gen=gen,
                   admission=admission, max_step_tokens=STEP)
    return analytic, des


def _des_tokens_per_s(des, admission):
    """Reserve admission at --qps inf runs all-at-once batches one after another, as the analytic
    all-at-once throughput does: the whole run. Paged admission refills as requests finish: its steady
    window, without the first batch's ramp and the last one's drain."""
    return des.tokens_per_s if admission == "reserve" else steady_window(des)["tokens_per_s"]


# (device, model, policy, cache ratio, prompt, gen, admission): several devices, models and policies
FAST = [
    ("h200-sxm", "llama-2-7b", "full", 1.0, 4096, 1024, "paged"),
    ("h200-sxm", "llama-2-7b", "keyformer", 0.5, 4096, 512, "paged"),
    ("l4", "llama-2-7b", "h2o", 0.25, 1024, 128, "paged"),
    ("a100-40g-sxm", "llama-3-8b", "streaming", 0.3, 1024, 128, "paged"),
    ("l40s", "gpt-j-6b", "keyformer", 0.2, 1024, 128, "paged"),
    ("a100-80g-sxm", "mpt-7b", "window", 0.5, 1024, 128, "reserve"),
    ("l40s", "gpt-j-6b", "full", 1.0, 1024, 128, "reserve"),
    ("h100-sxm", "mistral-7b", "keyformer", 0.5, 1024, 128, "reserve"),
]


@pytest.mark.parametrize("hw,model,policy,ratio,prompt,gen,admission", FAST)
def test_analytic_saturated_throughput_matches_the_des(hw, model, policy, ratio, prompt, gen, admission):
    if hw not in SHIPPED:
        pytest.skip(f"{hw} not shipped")
    analytic, des = _agreement(hw, model, policy, ratio, prompt, gen, admission)
    assert des.completed == des.config["requests"] and des.dropped == 0
    assert analytic == pytest.approx(_des_tokens_per_s(des, admission), rel=0.10)


@pytest.mark.slow
@pytest.mark.parametrize("admission", ["paged", "reserve"])
@pytest.mark.parametrize("policy,ratio", [("keyformer", 0.5), ("h2o", 0.25), ("streaming", 0.3), ("window", 0.5),
                                          ("full", 1.0)])
@pytest.mark.parametrize("hw,model", [("l4", "llama-2-7b"), ("a100-40g-sxm", "llama-3-8b"), ("h100-sxm", "mistral-7b"),
                                      ("a100-80g-sxm", "mpt-7b"), ("l40s", "gpt-j-6b")])
def test_analytic_saturated_throughput_matches_the_des_on_a_grid(hw, model, policy, ratio, admission):
    if hw not in SHIPPED:
        pytest.skip(f"{hw} not shipped")
    if policy == "full" and admission == "paged":
        pytest.skip("full attention under paged admission at --qps inf: recompute preemptions (docs/sim.md)")
    analytic, des = _agreement(hw, model, policy, ratio, 1024, 128, admission)
    assert analytic == pytest.approx(_des_tokens_per_s(des, admission), rel=0.10)
