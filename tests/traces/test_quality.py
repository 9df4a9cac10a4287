"""traces.quality on the tiny capture: tables, self-ROUGE against the full cache, ablation, figures."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import traces
from traces.quality import main, noise_ablation, noise_of, trace_quality

pytest.importorskip("rouge_score")


def test_noise_labels():
    assert noise_of("keyformer") == "gumbel"
    assert noise_of("keyformer(noise=none)") == "none"
    assert noise_of("keyformer(noise=none,tau_end=3)") is None
    assert noise_of("h2o") is None


def test_quality_table_and_reports(tiny_trace_dir, tmp_path, capsys):
    trace = traces.load(tiny_trace_dir)
    quality = trace_quality(trace).set_index(["policy", "cache_ratio"])
    assert quality.loc[("full", 1.0), "self_rougeL"] == pytest.approx(100.0)
    assert quality.loc[("full", 1.0), "mass_retained"] == pytest.approx(1.0, abs=1e-5)
    h2o = quality.loc["h2o"]["mass_retained"]
    assert h2o.loc[0.25] < h2o.loc[0.5] < h2o.loc[1.0]
    assert (quality["n_samples"] == 2).all()
    assert quality["trained_model"].eq(False).all()
    # ROUGE against references exists for every run, computed by rouge-score (0..100).
    assert quality["rouge1"].between(0, 100).all()

    assert main([str(tiny_trace_dir), "--out", str(tmp_path / "combined")]) == 0
    folder = tiny_trace_dir / "quality"
    for name in ("quality.csv", "quality.md", "fig7_rouge.png", "fig3b_mass.png", "noise_ablation.png"):
        assert (folder / name).stat().st_size > 0
        assert (tmp_path / "combined" / name).exists()
    md = (folder / "quality.md").read_text()
    assert "random untrained weights" in md and "Noise ablation" in md
    reread = traces.load(tiny_trace_dir).quality
    assert set(reread["policy"]) >= {"full", "window", "streaming", "h2o", "keyformer"}


def test_noise_ablation_pairs_variants_at_shared_ratios():
    frame = pd.DataFrame({
        "model": "m", "dataset": "d", "trace": "m/d", "policy": ["keyformer", "keyformer(noise=none)", "keyformer", "h2o"],
        "cache_ratio": [0.5, 0.5, 0.2, 0.5], "n_samples": 3, "rouge2": [10.0, 8.0, 5.0, 7.0],
        "mass_retained": [0.9, 0.8, 0.5, 0.8]})
    table = noise_ablation(frame)
    assert table["noise"].tolist() == ["gumbel", "none"]
    assert np.allclose(table["rouge2"], [10.0, 8.0])


def test_bootstrap_interval_covers_the_mean_and_clusters_move_together():
    from traces.stats import bootstrap, cluster_of

    rng = np.random.default_rng(1)
    values = rng.normal(5.0, 1.0, size=400)
    ci = bootstrap(values, np.arange(400))
    assert ci.lo < 5.0 < ci.hi and ci.lo < ci.mean < ci.hi and ci.n == 400 and ci.clusters == 400
    assert 0.15 < ci.hi - ci.lo < 0.25  # about 2 x 1.96 x 1 / sqrt(400)
    assert ci == bootstrap(values, np.arange(400))  # seeded
    # 4 clusters of 100 identical values: the interval is the spread of 4 units, not of 400
    clustered = np.repeat([1.0, 2.0, 3.0, 4.0], 100)
    wide = bootstrap(clustered, np.repeat(np.arange(4), 100))
    narrow = bootstrap(clustered, np.arange(400))
    assert wide.clusters == 4 and (wide.hi - wide.lo) > 4 * (narrow.hi - narrow.lo)
    assert bootstrap([np.nan, 1.0], [0, 1]).n == 1
    ppl = bootstrap(np.log([2.0, 4.0, 8.0]), [0, 1, 2], transform=np.exp)
    assert ppl.mean == pytest.approx(4.0)
    assert cluster_of("tinystories-3-450") == "tinystories-3" and cluster_of("xsum-12") == "xsum-12"


def test_intervals_seed_means_and_paired_differences(tiny_trace_dir):
    from traces.quality import aggregate, paired_differences, per_sample

    trace = traces.load(tiny_trace_dir)
    samples = per_sample(trace)
    assert {"rouge2", "self_rougeL", "mass_retained", "cluster"} <= set(samples.columns)
    table = aggregate(samples).set_index(["policy", "cache_ratio"])
    row = table.loc[("h2o", 0.5)]
    assert row["mass_retained_lo"] <= row["mass_retained"] <= row["mass_retained_hi"]
    paired = paired_differences(samples)
    assert set(paired["cache_ratio"]) == {0.25, 0.5, 1.0}
    direct = (samples[samples.policy == "keyformer"].set_index(["cache_ratio", "sample"])["mass_retained"]
              - samples[samples.policy == "h2o"].set_index(["cache_ratio", "sample"])["mass_retained"])
    got = paired[paired.metric == "mass_retained"].set_index("cache_ratio")["difference"]
    assert np.allclose(got.sort_index(), direct.groupby(level=0).mean().sort_index())
    assert not paired["resolved"].any()  # 2 samples: never enough clusters to call a difference
    # several seeds: per-seed rows renamed, `keyformer` is their per-sample mean
    extra = samples[samples.policy == "keyformer"].assign(policy="keyformer(seed=1)", mass_retained=0.0)
    from traces.quality import _with_seed_means
    pooled = _with_seed_means(pd.concat([samples.drop(columns="n_seeds"), extra], ignore_index=True))
    assert {"keyformer(seed=0)", "keyformer(seed=1)", "keyformer"} <= set(pooled.policy)
    mean = pooled[pooled.policy == "keyformer"].set_index(["cache_ratio", "sample"])["mass_retained"]
    seed0 = pooled[pooled.policy == "keyformer(seed=0)"].set_index(["cache_ratio", "sample"])["mass_retained"]
    assert np.allclose(mean.sort_index(), seed0.sort_index() / 2)
    assert (pooled.loc[pooled.policy == "keyformer", "n_seeds"] == 2).all()
