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
