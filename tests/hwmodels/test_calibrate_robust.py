"""hwmodels.calibrate on a busy machine (issue 17): a standard CPU plan that fits in about 2 minutes there
(the full one behind --thorough), a non-positive eager switch cost re-measured then bounded, and a failed
calibration that writes nothing."""
from __future__ import annotations

import importlib.util

import pytest

from hwmodels.calibrate.cli import parse_args
from hwmodels.calibrate.document import build_document, write_and_check
from hwmodels.calibrate.fit import fit
from hwmodels.calibrate.plan import GiB, Plan, make_plan
from hwmodels.errors import HardwareFileError

from .test_calibrate_fit import provenance, synthetic_series

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_standard_cpu_plan_is_the_full_one_without_its_slowest_points():
    full, standard = make_plan("cpu", False, thorough=True), make_plan("cpu", False, thorough=False)
    assert (full.mode, standard.mode) == ("full", "standard")
    assert make_plan("cpu", False) == full                       # library default: traces.timing's plan
    assert standard.pool_bytes == full.pool_bytes == GiB       # reads still stream from a pool > the LLC
    assert standard.stream_sizes[-1] == 256 * 2**20 and full.stream_sizes[-1] == GiB
    assert max(standard.gemm_sizes["fp32"]) == 2048 == max(full.gemm_sizes["fp32"])   # the primary dtype
    assert max(standard.gemm_sizes["bf16"]) == 1024 and max(full.gemm_sizes["bf16"]) == 4096
    assert standard.long_call_s == 0.2 and full.long_call_s is None
    assert standard.repeats == 7 < full.repeats
    # every kind of series the fit and the eager profiles read is still measured
    assert standard.skinny_sides == full.skinny_sides and standard.attn_head_dims == full.attn_head_dims
    assert standard.eager_stream_weight_bytes and standard.fresh_sizes == full.fresh_sizes
    # the dropped GEMMs were ~70% of the full plan's time here (55 of 81 s): n^3 work of the GEMM points
    work = lambda plan: sum(n ** 3 for ns in plan.gemm_sizes.values() for n in ns)  # noqa: E731
    assert work(standard) < 0.25 * work(full)
    assert make_plan("cuda", False, thorough=False) == make_plan("cuda", False)   # a GPU has one plan


def test_thorough_and_quick_flags(tmp_path):
    assert parse_args(["--device", "cpu", "--out", str(tmp_path / "a.yaml")]).thorough is False
    assert parse_args(["--device", "cpu", "--thorough", "--out", str(tmp_path / "a.yaml")]).thorough is True
    for argv, fragment in ((["--device", "cpu", "--quick", "--thorough"], "not both"),
                           (["--merge", "a.yaml", "--thorough", "--out", "b.yaml"], "--thorough measures")):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2


def test_standard_mode_documents_load():
    Plan(**{**make_plan("cpu", True).__dict__, "mode": "standard"})      # a valid mode


def test_an_invalid_calibration_writes_nothing(tmp_path):
    series = synthetic_series()
    doc = build_document("test-cpu", "synthetic", 16e9, "test", fit(series, "fp32"), series, provenance(), "fp32")
    doc["launch_overhead"]["value"] = 0.0                      # what the loader rejects (a fit bug)
    out = tmp_path / "my-cpu.yaml"
    with pytest.raises(HardwareFileError, match="must be positive"):
        write_and_check(out, doc)
    assert list(tmp_path.iterdir()) == []                      # neither the file nor a temporary
    out.write_text("previous: file\n")
    with pytest.raises(HardwareFileError):
        write_and_check(out, doc)
    assert out.read_text() == "previous: file\n"               # an existing file is left as it was


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_eager_switch_pair_is_remeasured_until_streaming_is_slower(monkeypatch):
    from hwmodels.calibrate import eager_bench
    from hwmodels.calibrate.fit import Series

    plan = Plan(**{**make_plan("cpu", True).__dict__, "eager_stream_weight_bytes": 2**16,
                   "eager_stream_pool_bytes": 2**18})
    hot = iter([8e-3, 9e-3, 1e-3])          # seconds per stack: the first two hot medians were preempted
    streamed = iter([5e-3, 6e-3, 4e-3])
    monkeypatch.setattr(eager_bench, "median_excluding_stream", lambda *a: next(streamed))
    monkeypatch.setattr(eager_bench, "count_top_level_calls", lambda forward: 400)
    series = {}

    def new(name, what, kind):
        series[name] = Series(name, what, kind)
        return series[name]

    eager_bench.run_eager_call(plan, None, new, lambda label: None, lambda *a: next(hot))
    per_layer = eager_bench.LAYERS
    assert series["eager_call"].points == [(400 / per_layer, 1e-3 / per_layer)]
    assert series["eager_stream"].points == [(eager_bench.STREAMS_PER_LAYER, 4e-3 / per_layer)]
    # bounded: after STREAM_ATTEMPTS pairs the last pair is kept (fit() then bounds it with a warning)
    hot, streamed = iter([9e-3] * 5), iter([1e-3] * 5)
    series.clear()
    eager_bench.run_eager_call(plan, None, new, lambda label: None, lambda *a: next(hot))
    assert len(list(hot)) == 5 - eager_bench.STREAM_ATTEMPTS


class CountingTimer:
    """A timer whose every call of the op takes `seconds` (no real work): counts the calls."""

    def __init__(self, seconds):
        self.seconds, self.calls = seconds, 0

    def sync(self):
        pass

    def run(self, fn, loops):
        self.calls += loops
        return self.seconds * loops


def test_long_calls_take_three_unlooped_samples_in_the_standard_plan():
    from hwmodels.calibrate.bench import median_seconds
    standard, full = make_plan("cpu", False, thorough=False), make_plan("cpu", False, thorough=True)
    slow = CountingTimer(2.5)                  # a 2048^3 GEMM on a busy 2-core machine
    assert median_seconds(lambda: None, slow, standard) == 2.5
    assert slow.calls == 3                     # (+2 warm-up calls outside the timer): 5 calls, not 2 + 3 + 7
    slow = CountingTimer(2.5)
    assert median_seconds(lambda: None, slow, full) == 2.5 and slow.calls == 3 + full.repeats   # unchanged
    fast = CountingTimer(1e-5)                 # short ops still loop to min_sample_s, `repeats` samples
    assert median_seconds(lambda: None, fast, standard) == pytest.approx(1e-5)
    assert fast.calls == 3 + standard.repeats * 200
