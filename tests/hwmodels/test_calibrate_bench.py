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
    assert {"dispatch", "host_step", "eager_call", "read", "copy", "gemv_fp32", "gemm_fp32"} == set(series)
    assert len(labels) == plan.n_points()
    assert [p[0] for p in series["gemv_fp32"].points] == [128 * 128 * 4, 256 * 256 * 4]
    assert [p[0] for p in series["copy"].points] == [2 * 64 * 2**10, 2 * 256 * 2**10]
    # every point is one call of 5 us, except eager_call's: one forward of the stack, per layer
    assert all(t == pytest.approx(5e-6) for s in series.values() if s.name != "eager_call" for _, t in s.points)
    fit(series, "fp32")   # the shared fit accepts what the shared benchmarks produce


def test_skinny_gemm_series_per_side():
    from hwmodels.calibrate.bench import run_all
    from hwmodels.calibrate.fit import fit
    from hwmodels.calibrate.plan import Plan
    plan = Plan("cpu", "quick", (64 * 2**10, 256 * 2**10), ("fp32",), {"fp32": (16, 32)}, "fp32",
                pool_bytes=2**20, repeats=3, min_sample_s=1e-4, skinny_sides=(64, 128), skinny_rows=(1, 2, 4))
    labels = []
    series = run_all(plan, labels.append, timer=ScriptedTimer(5e-6))
    assert {"skinny_fp32_n64", "skinny_fp32_n128", "skinny_io_fp32_n64", "skinny_io_fp32_n128"} <= set(series)
    assert [p[0] for p in series["skinny_fp32_n128"].points] == [1, 2, 4]
    assert [p[0] for p in series["skinny_io_fp32_n128"].points] == [1, 2, 4]
    assert len(labels) == plan.n_points()
    result = fit(series, "fp32")
    assert result.rows_table is not None and result.rows_table.sizes == (1, 2, 4)
    # the [in, out] layout (torch.addmm, as Conv1D) gets its own table from its own series
    assert result.rows_in_out_table is not None and result.rows_in_out_table.sizes == (1, 2, 4)
    assert "skinny_io_fp32_n64" in result.rows_in_out_from and "skinny_fp32" not in result.rows_in_out_from


def test_eager_call_series_counts_top_level_calls_per_layer():
    from hwmodels.calibrate.bench import run_all
    from hwmodels.calibrate.eager_bench import LAYERS
    from hwmodels.calibrate.fit import fit
    from hwmodels.calibrate.plan import Plan
    plan = Plan("cpu", "quick", (64 * 2**10,), ("fp32",), {"fp32": (16,)}, "fp32",
                pool_bytes=2**20, repeats=3, min_sample_s=1e-4)
    series = run_all(plan, timer=ScriptedTimer(1e-3))    # 1 ms per forward of the whole stack
    eager = series["eager_call"]
    assert eager.size_kind == "calls" and len(eager.points) == 1
    calls, seconds = eager.points[0]
    # norms, projections, rotary, attention, MLP, residuals: dozens of top-level aten calls per layer
    assert 30 <= calls <= 120 and float(calls * LAYERS).is_integer()
    assert seconds == pytest.approx(1e-3 / LAYERS)
    assert fit(series, "fp32").eager_call_overhead_s == pytest.approx(1e-3 / LAYERS / calls)


def test_measure_discounts_its_callers_own_busy_threads(monkeypatch):
    # traces.timing calibrates in its own process, whose spinning thread keeps the load average near 1:
    # with own_load=1 that alone is no contention; more than that still warns, and says whose load it is.
    import hwmodels.calibrate.bench as bench
    from hwmodels.calibrate import hostinfo
    from hwmodels.calibrate.cli import measure

    from .test_calibrate_fit import synthetic_series
    monkeypatch.setattr(bench, "run_all", lambda plan, progress=None, timer=None: synthetic_series())
    for load, own, warns in ((1.02, 0.0, True), (1.02, 1.0, False), (2.1, 1.0, True)):
        monkeypatch.setattr(hostinfo, "load_average", lambda: [load, load, load])
        said = []
        measure("cpu", True, "ACTIVE", say=said.append, own_load=own)
        warnings = [line for line in said if line.startswith("warning: load average")]
        assert bool(warnings) == warns, (load, own, said)
        if warnings and own:
            assert "1 of it this process's own threads" in warnings[0]


def test_streaming_plan_adds_the_eager_stream_series():
    # real timer, tiny weights: the point is the series' shape and that the GEMVs' time is excluded
    from hwmodels.calibrate.bench import WallTimer, median_seconds
    from hwmodels.calibrate.eager_bench import STREAMS_PER_LAYER, run_eager_call
    from hwmodels.calibrate.fit import Series
    from hwmodels.calibrate.plan import Plan
    plan = Plan("cpu", "quick", (64 * 2**10,), ("fp32",), {"fp32": (16,)}, "fp32", pool_bytes=2**20,
                repeats=3, min_sample_s=1e-4, eager_stream_weight_bytes=64 * 2**10,
                eager_stream_pool_bytes=512 * 2**10)
    series, ticks = {}, []

    def new(name, what, kind):
        series[name] = Series(name, what, kind)
        return series[name]

    run_eager_call(plan, WallTimer(), new, ticks.append, median_seconds)
    assert set(series) == {"eager_call", "eager_stream"} and len(ticks) == 2
    streams, seconds = series["eager_stream"].points[0]
    assert streams == STREAMS_PER_LAYER and seconds > 0
    assert "streamed" in series["eager_stream"].what
    with pytest.raises(ValueError, match="pool of at least two weights"):
        Plan("cpu", "quick", (64 * 2**10,), ("fp32",), {"fp32": (16,)}, "fp32", pool_bytes=2**20, repeats=3,
             min_sample_s=1e-4, eager_stream_weight_bytes=64 * 2**10, eager_stream_pool_bytes=64 * 2**10)
