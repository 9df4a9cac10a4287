"""The shared timing plumbing of hwmodels.calibrate.bench (CPU and CUDA differ only in the
timer), exercised with a scripted timer so the statistics are exact."""
import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


class ScriptedTimer:
    """Pretends every call takes `per_call` seconds, except that sample number k in
    `stalled` (counting samples after warm-up) takes an extra `stall` seconds."""
    name = "scripted"

    def __init__(self, per_call, stalled=(), stall=0.016):
        self.per_call, self.stalled, self.stall = per_call, set(stalled), stall
        self.samples, self.syncs, self.loops = 0, 0, []

    def sync(self):
        self.syncs += 1

    def run(self, fn, loops):
        for _ in range(min(loops, 3)):
            fn()
        self.loops.append(loops)
        extra = self.stall if self.samples in self.stalled else 0.0
        self.samples += 1
        return loops * self.per_call + extra


def test_median_ignores_a_minority_of_stalled_samples():
    from hwmodels.calibrate.bench import median_seconds
    from hwmodels.calibrate.plan import make_plan
    plan = make_plan("cpu", True)                # 3 repeats
    timer = ScriptedTimer(2e-6, stalled={0, 3})  # one loop-count probe and one sample stall
    calls = []
    assert median_seconds(lambda: calls.append(1), timer, plan) == pytest.approx(2e-6, rel=1e-3)
    assert timer.syncs >= 1 and calls
    # the loop count came from the unstalled probes: each sample lasts >= min_sample_s
    assert timer.loops[-1] * 2e-6 >= plan.min_sample_s


def test_run_all_with_an_injected_timer_fills_every_series():
    from hwmodels.calibrate.bench import run_all
    from hwmodels.calibrate.fit import fit
    from hwmodels.calibrate.plan import Plan
    plan = Plan("cpu", "quick", (64 * 2**10, 256 * 2**10), ("fp32",), {"fp32": (16, 32)}, "fp32",
                pool_bytes=2**20, repeats=3, min_sample_s=1e-4)
    labels = []
    series = run_all(plan, labels.append, timer=ScriptedTimer(5e-6))
    assert {"dispatch", "host_step", "read", "copy", "gemv_fp32", "gemm_fp32"} == set(series)
    assert len(labels) == plan.n_points()
    assert [p[0] for p in series["gemv_fp32"].points] == [128 * 128 * 4, 256 * 256 * 4]
    assert [p[0] for p in series["copy"].points] == [2 * 64 * 2**10, 2 * 256 * 2**10]
    assert all(t == pytest.approx(5e-6) for s in series.values() for _, t in s.points)
    fit(series, "fp32")   # the shared fit accepts what the shared benchmarks produce


def test_skinny_gemm_series_per_side():
    from hwmodels.calibrate.bench import run_all
    from hwmodels.calibrate.fit import fit
    from hwmodels.calibrate.plan import Plan
    plan = Plan("cpu", "quick", (64 * 2**10, 256 * 2**10), ("fp32",), {"fp32": (16, 32)}, "fp32",
                pool_bytes=2**20, repeats=3, min_sample_s=1e-4, skinny_sides=(64, 128), skinny_rows=(1, 2, 4))
    labels = []
    series = run_all(plan, labels.append, timer=ScriptedTimer(5e-6))
    assert {"skinny_fp32_n64", "skinny_fp32_n128"} <= set(series)
    assert [p[0] for p in series["skinny_fp32_n128"].points] == [1, 2, 4]
    assert len(labels) == plan.n_points()
    result = fit(series, "fp32")
    assert result.rows_table is not None and result.rows_table.sizes == (1, 2, 4)
