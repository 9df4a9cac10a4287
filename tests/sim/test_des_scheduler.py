"""Scheduler and simpy server with a trivial step-time model injected: invariants, exact timings, metrics."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import kvlen
from sim.des import Scheduler, SchedulerConfig, ServingSimulation, Workload, synthetic_workload
from sim.des.metrics import build_result


class LinearTimer:
    """decode: base + per_kv * sum(kv); prefill: base + per_token * new tokens. Easy to sum by hand."""

    def __init__(self, base=0.01, per_kv=1e-6, per_token=1e-4):
        self.base, self.per_kv, self.per_token = base, per_kv, per_token

    def decode(self, kv):
        return self.base + self.per_kv * float(np.sum(kv))

    def prefill(self, chunks):
        return self.base + self.per_token * sum(new for new, *_ in chunks)

    def mixed(self, kv, chunks):
        return self.base + self.per_kv * float(np.sum(kv)) + self.per_token * sum(new for new, *_ in chunks)


class FormulaKV:
    """Per-step cached tokens from sim.kvlen (cached per length pair, as the real provider does)."""

    def __init__(self, policy="full", cache_ratio=1.0):
        self.policy, self.ratio, self._cache = policy, cache_ratio, {}

    def decode_kv(self, request, prompt, gen):
        key = (prompt, gen)
        if key not in self._cache:
            self._cache[key] = kvlen.kv_tokens(self.policy, prompt, np.arange(max(gen, 1)), self.ratio)
        return self._cache[key]


def run(workload, *, policy="full", ratio=1.0, capacity_blocks=10_000, block=16, timer=None, **cfg):
    config = SchedulerConfig(block_tokens=block, capacity_blocks=capacity_blocks, block_bytes=float(block), **cfg)
    sched = Scheduler(workload, FormulaKV(policy, ratio), config)
    sim = ServingSimulation(sched, timer or LinearTimer(), check_every_step=True)
    timeline, wall = sim.run()
    result = build_result(sched, timeline, config={}, weight_bytes=0.0, workspace_bytes=0.0, wall_s=wall)
    return sched, result


def one_request(prompt=100, gen=20, at=0.0):
    return Workload(np.array([at]), np.array([prompt]), np.array([gen]), "test")


def test_single_request_timings_are_exact_sums_of_step_times():
    timer = LinearTimer()
    n, g = 100, 20
    _, res = run(one_request(n, g), timer=timer)
    prefill = timer.prefill([(n, 0)])
    decodes = [timer.decode(np.array([n + s])) for s in range(g - 1)]
    assert res.ttft_s["mean"] == pytest.approx(prefill, rel=1e-12)
    assert res.e2e_s["mean"] == pytest.approx(prefill + sum(decodes), rel=1e-12)
    assert res.tpot_s["mean"] == pytest.approx(np.mean(decodes), rel=1e-12)
    assert res.itl_s["mean"] == pytest.approx(np.mean(decodes), rel=1e-12)
    assert res.queue_s["mean"] == 0.0
    assert res.completed == 1 and res.dropped == 0 and res.steps == g
    assert res.tokens_per_s == pytest.approx(g / (prefill + sum(decodes)))


def test_single_output_token_request_has_no_tpot():
    _, res = run(one_request(50, 1))
    assert res.completed == 1 and res.tpot_s["mean"] is None and res.steps == 1


def test_queueing_delay_when_arriving_during_a_step():
    # Second request arrives while the first one's prefill runs: it waits for the step to end.
    timer = LinearTimer(base=1.0, per_kv=0.0, per_token=0.0)
    wl = Workload(np.array([0.0, 0.5]), np.array([10, 10]), np.array([3, 3]), "test")
    sched, res = run(wl, timer=timer)
    assert sched.first_scheduled[1] == pytest.approx(1.0)
    assert res.requests.queue_s.tolist() == pytest.approx([0.0, 0.5])


def test_percentiles_follow_numpy_linear_interpolation():
    wl = synthetic_workload("poisson", 5.0, 40, 64, 8, seed=3)
    _, res = run(wl)
    done = res.requests[res.requests.completed]
    for key in ("ttft_s", "e2e_s", "tpot_s"):
        assert res.__dict__[key]["p90"] == pytest.approx(np.percentile(done[key], 90))
        assert res.__dict__[key]["mean"] == pytest.approx(done[key].mean())
    # every token after the first of every request contributes one ITL gap (no preemption here)
    assert res.preemptions == 0


def test_full_attention_preempts_under_memory_pressure_and_still_completes_everything():
    # 8 requests of 64 + 192 tokens need 16 blocks each at the end; 60 blocks hold fewer than 4.
    wl = Workload(np.zeros(8), np.full(8, 64), np.full(8, 192), "test")
    sched, res = run(wl, capacity_blocks=60, watermark=0.0)
    assert res.completed == 8 and res.dropped == 0
    assert res.preemptions > 0
    assert res.peak_kv_bytes <= res.kv_capacity_bytes
    assert (res.timeline.kv_bytes <= res.kv_capacity_bytes).all()
    # a preempted request recomputes prompt + generated tokens: one prefill step with more than 64 tokens
    assert (res.timeline.prefill_tokens > 64).any()


def test_reserve_admission_never_preempts():
    wl = Workload(np.zeros(8), np.full(8, 64), np.full(8, 192), "test")
    _, res = run(wl, capacity_blocks=60, admission="reserve")
    assert res.completed == 8 and res.preemptions == 0
    # 64 + 191 + ... tokens -> 16 blocks reserved per request: at most 3 fit in 60 blocks
    assert res.max_batch_seen <= 3


def test_evicting_policy_batches_more_requests_than_full_attention():
    wl = Workload(np.zeros(40), np.full(40, 256), np.full(40, 256), "test")
    common = dict(capacity_blocks=200, admission="reserve")
    _, full = run(wl, policy="full", **common)
    _, kf = run(wl, policy="keyformer", ratio=0.5, **common)
    # full reserves 256 + 256 tokens = 32 blocks, keyformer max(256, 129) = 16 blocks
    assert full.max_batch_seen == 200 // 32
    assert kf.max_batch_seen == 200 // 16
    assert kf.tokens_per_s > 1.8 * full.tokens_per_s


def test_request_larger_than_memory_is_dropped_and_reported():
    wl = Workload(np.array([0.0, 0.1, 0.2]), np.array([32, 5000, 32]), np.array([4, 4, 4]), "test")
    _, res = run(wl, capacity_blocks=100)
    assert res.completed == 2 and res.dropped == 1
    assert res.requests.dropped.tolist() == [False, True, False]
    assert "KV memory" in res.requests.drop_reason[1]
    assert res.to_dict()["drop_reasons"] == {res.requests.drop_reason[1]: 1}


def test_max_batch_caps_requests_in_flight():
    wl = Workload(np.zeros(30), np.full(30, 16), np.full(30, 32), "test")
    _, res = run(wl, max_batch=4)
    assert res.max_batch_seen == 4 and res.completed == 30


def test_chunked_prefill_respects_the_token_budget():
    wl = Workload(np.array([0.0, 0.0, 0.05]), np.array([1000, 300, 700]), np.array([50, 50, 50]), "test")
    _, res = run(wl, chunked_prefill=256)
    tl = res.timeline
    assert ((tl.decodes + tl.prefill_tokens) <= 256).all()
    assert res.completed == 3
    # the 1000-token prompt needs ceil(1000 / 256) = 4 steps before its first token
    assert (tl.prefill_tokens > 0).sum() >= 4
    # decodes and prefill chunks share steps
    assert ((tl.decodes > 0) & (tl.prefill_tokens > 0)).any()


def test_same_seed_same_result_other_seed_differs():
    a = run(synthetic_workload("poisson", 20.0, 60, 128, 32, seed=7), capacity_blocks=80)[1]
    b = run(synthetic_workload("poisson", 20.0, 60, 128, 32, seed=7), capacity_blocks=80)[1]
    c = run(synthetic_workload("poisson", 20.0, 60, 128, 32, seed=8), capacity_blocks=80)[1]
    cols = ["arrival_s", "first_token_s", "finish_s", "preemptions"]
    assert a.requests[cols].equals(b.requests[cols])
    assert a.to_row() == {**b.to_row(), "wall_s": a.wall_s}
    assert not a.requests.arrival_s.equals(c.requests.arrival_s)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 25),
    qps=st.sampled_from([0.5, 5.0, 50.0, float("inf")]),
    policy=st.sampled_from(kvlen.POLICIES),
    ratio=st.sampled_from([0.2, 0.5, 1.0]),
    capacity=st.integers(8, 120),
    chunk=st.sampled_from([None, 16, 64, 512]),
    admission=st.sampled_from(["paged", "reserve"]),
    max_batch=st.sampled_from([None, 1, 3, 8]),
    seed=st.integers(0, 10_000),
)
def test_invariants_hold_for_random_workloads(n, qps, policy, ratio, capacity, chunk, admission, max_batch, seed):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, n / min(qps, 1e9), n)) if np.isfinite(qps) else np.zeros(n)
    wl = Workload(arrival, rng.integers(1, 400, n), rng.integers(1, 120, n), "random")
    sched, res = run(wl, policy=policy, ratio=ratio, capacity_blocks=capacity, chunked_prefill=chunk,
                     admission=admission, max_batch=max_batch)
    # every request completes or is reported dropped (run() also asserts this), with a reason
    assert res.completed + res.dropped == n
    assert all(res.requests.drop_reason[res.requests.dropped] != "")
    # memory never over capacity, at every step and at the peak
    assert sched.pool.peak_blocks <= capacity
    assert (res.timeline.kv_bytes <= res.kv_capacity_bytes).all()
    assert sched.pool.used_blocks == 0
    if max_batch is not None:
        assert (res.timeline.batch <= max_batch).all()
    if admission == "reserve":
        assert res.preemptions == 0
    done = res.requests[res.requests.completed]
    # causality: arrival <= scheduled <= first token <= finish
    assert (done.first_scheduled_s >= done.arrival_s).all()
    assert (done.first_token_s > done.first_scheduled_s).all()
    assert (done.finish_s >= done.first_token_s).all()


def test_scheduler_config_rejects_bad_values():
    with pytest.raises(ValueError, match="admission"):
        SchedulerConfig(admission="lazy")
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        SchedulerConfig(max_batch=0)
    with pytest.raises(ValueError, match="chunked_prefill must be >= 1"):
        SchedulerConfig(chunked_prefill=0)


def test_memory_over_time_is_time_weighted():
    from sim.des.metrics import summarize_over_time
    stats = summarize_over_time([1.0, 2.0, 3.0], [1.0, 1.0, 2.0])
    assert stats == {"mean": 2.25, "p50": 2.0, "p90": 3.0, "p99": 3.0}
    # idle time holds no KV: 4 s busy at 2.0 and 4 s idle -> mean 1.0, median 0
    assert summarize_over_time([2.0], [4.0], idle_s=4.0) == {"mean": 1.0, "p50": 0.0, "p90": 2.0, "p99": 2.0}


def test_kv_memory_summary_matches_the_timeline():
    wl = synthetic_workload("poisson", 3.0, 30, 200, 40, seed=4)
    _, res = run(wl, capacity_blocks=60)
    tl = res.timeline
    assert res.kv_bytes["mean"] == pytest.approx((tl.kv_bytes * tl.dt_s).sum() / res.makespan_s)
    assert res.kv_bytes["p99"] <= res.peak_kv_bytes <= res.kv_capacity_bytes


def test_busy_time_splits_into_step_kinds():
    timer = LinearTimer()
    _, res = run(one_request(100, 5), timer=timer)
    assert res.busy_s["prefill"] == pytest.approx(timer.prefill([(100, 0)]))
    assert res.busy_s["mixed"] == 0.0
    assert sum(res.busy_s.values()) == pytest.approx(res.timeline.dt_s.sum())
    _, chunked = run(Workload(np.zeros(2), np.array([40, 300]), np.array([20, 5]), "t"), chunked_prefill=64)
    assert chunked.busy_s["mixed"] > 0
