"""A fixed batch the deployment cannot hold at once (issue 25: static TP with long generation over-predicted):
Llama-2-70B fp16 on 2x A100-80GB holds 64.2 GiB of weights per GPU, so 64 requests of 128 + 2048 tokens do not
fit at their peak and run in waves of the largest batch that does; the wave-aware throughput is what such a
benchmark measures, and sim.validation.multigpu predicts fixed-batch rows with it."""
import json

import pytest

from sim import parallel, predict
from sim.parallel.predict import waves

A100_TP2 = dict(kv_dtype="fp16", weight_dtype="fp16")


def test_waves_arithmetic():
    assert waves(64, 100) == (1, 64) and waves(64, 64) == (1, 64)
    assert waves(64, 45) == (2, 19) and waves(90, 45) == (2, 45)
    assert waves(5, 0) == (0, 0)


def test_a_batch_that_does_not_fit_runs_in_waves_of_what_fits():
    p = parallel.predict("a100-80g-sxm", "llama-2-70b", 64, 128, 2048, "full", 1.0, tp=2, **A100_TP2)
    at_once = p.max_batch_all_at_once
    assert not p.extra["fits"] and 0 < at_once < 64
    n, last = waves(64, at_once)
    assert p.extra["waves"] == n >= 2
    e2e = sum(parallel.predict("a100-80g-sxm", "llama-2-70b", b, 128, 2048, "full", 1.0, tp=2, **A100_TP2).e2e_s
              for b in [at_once] * (n - 1) + [last])
    assert p.extra["e2e_in_waves_s"] == pytest.approx(e2e, rel=1e-9)
    assert p.extra["tokens_per_s_in_waves"] == pytest.approx(64 * 2048 / e2e, rel=1e-9)
    # the as-if-it-fit number over-predicts such a run by much more than the audit's smallest miss (39%)
    assert p.tokens_per_s / p.extra["tokens_per_s_in_waves"] > 1.4
    # with four GPUs the same batch fits: one wave, the batch's own numbers
    p4 = parallel.predict("a100-80g-sxm", "llama-2-70b", 64, 128, 2048, "full", 1.0, tp=4, **A100_TP2)
    assert p4.extra["fits"] and p4.extra["waves"] == 1
    assert p4.extra["tokens_per_s_in_waves"] == pytest.approx(p4.tokens_per_s) and p4.extra["e2e_in_waves_s"] == p4.e2e_s


def test_one_device_gets_the_same_keys():
    p = parallel.predict("h100-sxm", "llama-2-13b", 512, 2048, 2048, "full", 1.0)
    assert p.extra["waves"] == waves(512, p.max_batch_all_at_once)[0] >= 2
    assert p.extra["tokens_per_s_in_waves"] < p.tokens_per_s


def test_sim_predict_tp_prints_the_waves(capsys):
    argv = ["--hw", "a100-80g-sxm", "--model", "llama-2-70b", "--batch", "64", "--prompt", "128", "--gen", "2048",
            "--weight-dtype", "fp16", "--kv-dtype", "fp16", "--tp", "2", "--profile", "fused"]
    assert predict.main(argv + ["--json"]) == 0
    out = capsys.readouterr().out
    d = json.loads(out[out.index("{"):])
    assert d["waves"] >= 2 and d["tokens_per_s_in_waves"] < d["tokens_per_s"]
    assert predict.main(argv) == 0
    assert f"{d['waves']} waves of at most {d['max_batch_all_at_once']}" in capsys.readouterr().out


def test_multigpu_rows_of_a_fixed_batch_are_predicted_in_waves():
    from sim.validation import multigpu
    row = dict(hw="a100-80g-sxm", model="llama-2-70b", batch=64, prompt=128, gen=2048, tp=2, runtime="classic",
               metric="out_tok_per_s", fixed_batch=True, **A100_TP2)
    p = parallel.predict("a100-80g-sxm", "llama-2-70b", 64, 128, 2048, "full", 1.0, tp=2, profile="fused",
                         **A100_TP2)
    assert multigpu.predict_value(row, "fused") == pytest.approx(p.extra["tokens_per_s_in_waves"])
    # an in-flight row runs at its steady-state batch: the batch's own throughput
    assert multigpu.predict_value(dict(row, fixed_batch=False), "fused") == pytest.approx(p.tokens_per_s)
    with pytest.raises(ValueError, match="fits"):
        multigpu.predict_value(dict(row, tp=1), "fused")
