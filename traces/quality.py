"""Quality per policy x cache ratio from trace folders: `python -m traces.quality DIR... [--out DIR]`.

Metrics (shared/docs/transformers-kv-notes.md §4):
- ROUGE-1/2/L F1 (x100, `rouge-score` with the Porter stemmer, offline) of the generated text against the
  dataset's reference, mean over samples;
- self-ROUGE-1/2/L against the full-cache output of the same sample (no labels needed; the full cache
  scores 100 by definition);
- attention mass retained (mean over samples, steps, layers and KV heads) and the kept fraction of the
  context;
- teacher-forced traces (long-text): perplexity, its ratio to the full cache's, and top-1 next-token
  agreement with the full cache at the same position;
- `rouge2_pct_full`: ROUGE-2 as % of the full cache's (the paper's 99% line).

Writes quality.csv and quality.md (plus PNGs: the Figure 7 and Figure 3b analogues and the noise ablation)
into DIR/quality/ of every trace, and a combined set into --out when given.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvcommon.cli import OneLineParser, atomic_writer, check_out_folder, run

import traces
from traces import schema

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")
FULL = "full"


def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)


def _rouge(scorer, prediction: str, reference: str) -> dict:
    if not reference.strip():
        return {k: math.nan for k in ROUGE_KEYS}
    scores = scorer.score(reference, prediction)
    return {k: 100.0 * scores[k].fmeasure for k in ROUGE_KEYS}


def noise_of(label: str) -> str | None:
    """'gumbel' for plain keyformer (the seed mean when several seeds were captured), the noise parameter of
    a keyformer noise variant, None otherwise (per-seed rows, the official-selection variant)."""
    name, params = _parse_label(label)
    if name != "keyformer" or set(params) - {"noise"}:
        return None
    return params.get("noise", "gumbel")


def _parse_label(label: str) -> tuple[str, dict]:
    match = re.fullmatch(r"([^()]+)(?:\((.*)\))?", str(label))
    if not match:
        return str(label), {}
    params = dict(p.split("=", 1) for p in (match.group(2) or "").split(",") if "=" in p)
    return match.group(1), params


def seed_of(label: str) -> tuple[str, int] | None:
    """(family, seed) for a policy that differs from its family only by its noise seed: 'keyformer' is
    seed 0 (the captures' default), 'keyformer(seed=2)' seed 2; None for any other variant."""
    name, params = _parse_label(label)
    if name != "keyformer" or set(params) - {"seed"}:
        return None
    return name, int(params.get("seed", 0))


PAIRED_METRICS = ("rouge2", "rougeL", "self_rougeL", "mass_retained", "nll", "top1_agreement")
# A percentile bootstrap over fewer independent units than this is too narrow to trust: no difference is
# called resolved below it (the TinyStories traces have 5 stories).
MIN_CLUSTERS = 10
# Per-sample metrics that get a mean and a bootstrap interval in the tables.
INTERVAL_METRICS = ("rouge1", "rouge2", "rougeL", "self_rouge2", "self_rougeL", "mass_retained", "kept_fraction",
                    "nll", "top1_agreement")


def per_sample(trace: traces.Trace) -> pd.DataFrame:
    """One row per policy x cache ratio x sample: ROUGE (free generation), self-ROUGE against the full
    cache's output, mean attention mass retained and kept fraction over the sample's steps, and for
    teacher-forced traces the mean NLL of the forced tokens and the top-1 agreement with the full cache."""
    from traces.stats import cluster_of

    scorer = _scorer()
    texts = trace.texts.copy()
    texts["cache_ratio"] = texts["cache_ratio"].astype(float).round(4)
    teacher_forced = trace.manifest["dataset"].get("mode") == "teacher_forced"
    full = texts[texts["policy"] == FULL].set_index("sample")["generated"].to_dict()
    rows = []
    for rec in texts.itertuples(index=False):
        row = {"policy": rec.policy, "cache_ratio": rec.cache_ratio, "sample": rec.sample}
        if not teacher_forced:
            row.update(_rouge(scorer, rec.generated, rec.reference or ""))
            if rec.sample in full:
                if rec.generated == full[rec.sample]:  # identical (also when both are empty)
                    row.update({f"self_{k}": 100.0 for k in ROUGE_KEYS})
                else:
                    row.update({f"self_{k}": v for k, v in _rouge(scorer, rec.generated, full[rec.sample]).items()})
            row["identical_to_full"] = float(rec.generated == full.get(rec.sample))
        rows.append(row)
    frame = pd.DataFrame(rows).set_index(["policy", "cache_ratio", "sample"])

    kv = trace.kv.assign(cache_ratio=trace.kv["cache_ratio"].astype(float).round(4))
    kv = kv.assign(kept_fraction=kv["kv_len"] / (kv["prompt_len"] + kv["step"] + 1))
    frame = frame.join(kv.groupby(["policy", "cache_ratio", "sample"])[["mass_retained", "kept_fraction"]].mean())
    if teacher_forced:
        steps = trace.steps.assign(cache_ratio=trace.steps["cache_ratio"].astype(float).round(4))
        frame = frame.join(steps.groupby(["policy", "cache_ratio", "sample"])["nll"].mean())
        full_top1 = steps[steps["policy"] == FULL].set_index(["sample", "step"])["top1"].rename("full_top1")
        if not full_top1.empty:
            joined = steps.join(full_top1, on=["sample", "step"])
            frame = frame.join((joined["top1"] == joined["full_top1"]).groupby(
                [joined["policy"], joined["cache_ratio"], joined["sample"]]).mean().rename("top1_agreement"))
    frame = frame.reset_index()
    frame["cluster"] = frame["sample"].map(cluster_of)
    return _with_seed_means(frame)


def _with_seed_means(frame: pd.DataFrame) -> pd.DataFrame:
    """Keyformer captured at several noise seeds: its per-seed rows become `keyformer(seed=N)` and the row
    `keyformer` is the per-sample mean over the seeds (the estimate with the noise averaged out)."""
    seeds = {label: seed_of(label) for label in frame["policy"].unique()}
    seeded = [label for label, s in seeds.items() if s is not None]
    if len({seeds[label][1] for label in seeded}) < 2:
        return frame.assign(n_seeds=1)
    part = frame[frame["policy"].isin(seeded)]
    numeric = [c for c in part.columns if c not in ("policy", "cache_ratio", "sample", "cluster")]
    mean = part.groupby(["cache_ratio", "sample", "cluster"], as_index=False)[numeric].mean()
    mean = mean.assign(policy="keyformer", n_seeds=len(seeded))
    renamed = part.assign(policy=[f"keyformer(seed={seeds[p][1]})" for p in part["policy"]], n_seeds=1)
    rest = frame[~frame["policy"].isin(seeded)].assign(n_seeds=1)
    return pd.concat([rest, renamed, mean], ignore_index=True)


def aggregate(samples: pd.DataFrame) -> pd.DataFrame:
    """Per policy x cache ratio: the mean of every per-sample metric with its 95% bootstrap interval
    (`<metric>_lo`, `<metric>_hi`), the sample and cluster counts; perplexity and its ratio to the full
    cache's from the mean NLL (the ratio paired on the same samples)."""
    from traces.stats import bootstrap

    full_nll = None
    if "nll" in samples and (samples["policy"] == FULL).any():
        full_nll = samples[samples["policy"] == FULL].set_index("sample")["nll"]
    rows = []
    for (policy, ratio), group in samples.groupby(["policy", "cache_ratio"], sort=True):
        row = {"policy": policy, "cache_ratio": ratio, "n_samples": group["sample"].nunique(),
               "n_clusters": group["cluster"].nunique(), "n_seeds": int(group["n_seeds"].max())}
        for metric in INTERVAL_METRICS:
            if metric in group and group[metric].notna().any():
                ci = bootstrap(group[metric], group["cluster"])
                row.update({metric: ci.mean, f"{metric}_lo": ci.lo, f"{metric}_hi": ci.hi})
        if "identical_to_full" in group:
            row["identical_to_full"] = float(group["identical_to_full"].mean())
        if "nll" in row:
            ci = bootstrap(group["nll"], group["cluster"], transform=np.exp)
            row.update({"ppl": ci.mean, "ppl_lo": ci.lo, "ppl_hi": ci.hi})
            if full_nll is not None:
                diff = group["nll"].to_numpy() - group["sample"].map(full_nll).to_numpy()
                ci = bootstrap(diff, group["cluster"], transform=np.exp)
                row.update({"ppl_ratio": ci.mean, "ppl_ratio_lo": ci.lo, "ppl_ratio_hi": ci.hi})
        if "mass_retained" in group:
            row["mass_retained_min"] = float(group["mass_retained"].min())
        rows.append(row)
    return pd.DataFrame(rows)


def paired_differences(samples: pd.DataFrame, a: str = "keyformer", b: str = "h2o") -> pd.DataFrame:
    """Per cache ratio: mean of (a - b) over the samples both ran, with its bootstrap interval, for every
    metric both have. An interval that excludes 0 is a difference the data resolve."""
    from traces.stats import bootstrap

    left = samples[samples["policy"] == a].set_index(["cache_ratio", "sample"])
    right = samples[samples["policy"] == b].set_index(["cache_ratio", "sample"])
    # merge, not join(lsuffix=...): the same columns, without pandas' deprecation warning on stderr
    both = left.merge(right, how="inner", left_index=True, right_index=True, suffixes=("_a", "_b"))
    rows = []
    for ratio, group in both.groupby(level="cache_ratio"):
        for metric in PAIRED_METRICS:
            if f"{metric}_a" not in group or group[f"{metric}_a"].isna().all():
                continue
            diff = group[f"{metric}_a"] - group[f"{metric}_b"]
            ci = bootstrap(diff.to_numpy(), group["cluster_a"].to_numpy())
            rows.append({"comparison": f"{a} - {b}", "cache_ratio": ratio, "metric": metric, "difference": ci.mean,
                         "lo": ci.lo, "hi": ci.hi, "n_samples": ci.n, "n_clusters": ci.clusters,
                         "resolved": bool(ci.clusters >= MIN_CLUSTERS and np.isfinite(ci.lo)
                                          and (ci.lo > 0 or ci.hi < 0))})
    return pd.DataFrame(rows)


def _budget_notes(trace: traces.Trace) -> dict:
    """policy label -> 'budget_base/selection' as the capture ran it (real unpadded lengths unless said)."""
    notes = {}
    for label, variant in trace.manifest.get("policy", {}).get("variants", {}).items():
        params = variant.get("params", {})
        notes[label] = f"{params.get('budget_base', 'real')}/{params.get('selection', 'paper')}"
    return notes


def trace_quality(trace: traces.Trace, samples: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per policy x cache ratio of one trace (means with 95% intervals)."""
    samples = per_sample(trace) if samples is None else samples
    out = aggregate(samples)
    steps = trace.steps.assign(cache_ratio=trace.steps["cache_ratio"].astype(float).round(4))
    decode = steps[steps["phase"] == "decode"]
    decode_ms = decode.groupby(["policy", "cache_ratio"])["wall_s"].median() * 1e3
    out["decode_ms"] = [decode_ms.get((_capture_label(p), r), math.nan) for p, r in zip(out["policy"], out["cache_ratio"])]
    if "rouge2" in out and (out["policy"] == FULL).any():
        full_r2 = float(out.loc[out["policy"] == FULL, "rouge2"].iloc[0])
        out["rouge2_pct_full"] = 100.0 * out["rouge2"] / full_r2 if full_r2 > 0 else math.nan
    notes = _budget_notes(trace)
    out["budget"] = [notes.get(p, notes.get(_capture_label(p), "real/paper")) for p in out["policy"]]
    out.insert(0, "trace", f"{trace.path.resolve().parent.name}/{trace.path.resolve().name}")
    out.insert(0, "dataset", trace.manifest["dataset"]["name"])
    out.insert(0, "model", trace.model["name"])
    out["trained_model"] = trace.model.get("trained", True)
    return out.sort_values(["policy", "cache_ratio"]).reset_index(drop=True)


def _capture_label(label: str) -> str:
    """The label a per-seed row had in the capture ('keyformer(seed=0)' was captured as 'keyformer')."""
    return "keyformer" if label == "keyformer(seed=0)" else label


def noise_ablation(quality: pd.DataFrame) -> pd.DataFrame:
    """Table 4 analogue: keyformer noise variants at the cache ratio(s) they share, with intervals."""
    frame = quality.assign(noise=quality["policy"].map(noise_of)).dropna(subset=["noise"])
    if frame["noise"].nunique() < 2:
        return pd.DataFrame()
    keys = ["model", "dataset", "trace", "cache_ratio"]
    shared = frame.groupby(keys)["noise"].nunique()
    shared = shared[shared >= 2].index
    if shared.empty:
        return pd.DataFrame()
    frame = frame.set_index(keys).loc[shared].reset_index()
    cols = [c for c in ("rouge1", "rouge2", "rougeL", "self_rougeL", "mass_retained", "ppl", "top1_agreement")
            if c in frame]
    cols = [x for c in cols for x in (c, f"{c}_lo", f"{c}_hi") if x in frame]
    return frame[["model", "dataset", "trace", "cache_ratio", "noise", "n_samples", *cols]]


def _fmt(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"
    return str(value)


def to_markdown(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(none)\n"
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


SHOWN = ("rouge1", "rouge2", "rougeL", "rouge2_pct_full", "self_rougeL", "mass_retained", "kept_fraction", "ppl",
         "ppl_ratio", "top1_agreement", "identical_to_full", "decode_ms")
SHIFT_INVARIANCE = ("A constant added to every logit of a row leaves its softmax unchanged, so `constant` noise "
                    "ranks exactly as `none`; the paper's Table 4 constant column cannot come from a correct "
                    "implementation.")
METHOD = ("Each cell is a mean over samples with its 95% percentile-bootstrap interval (2000 resamples of "
          "clusters: the 40 cut points of one TinyStories story move together, other samples are their own "
          "cluster). ROUGE F1 x100 (rouge-score, stemmed) against the references; self_rougeL against the "
          "full-cache output of the same sample; mass_retained = share of the full-cache attention of the next "
          "query on the kept tokens (it favours H2O by construction: H2O keeps the tokens with the most "
          "accumulated attention); ppl from the mean NLL of the forced tokens, ppl_ratio paired against the full "
          "cache on the same samples. `keyformer` is the per-sample mean over its noise seeds (n_seeds); "
          "`budget` says what k is a fraction of (real = the unpadded prompt) and the selection rule (paper = "
          "re-rank every step, official = keys frozen at the prompt).")


def _cells(frame: pd.DataFrame, columns) -> pd.DataFrame:
    """Metric columns as 'mean [lo, hi]' text where an interval exists."""
    out = frame[[c for c in ("model", "dataset", "trace", "policy", "cache_ratio", "n_samples", "n_clusters",
                             "n_seeds", "budget") if c in frame]].copy()
    for column in columns:
        if column not in frame or frame[column].isna().all():
            continue
        lo, hi = f"{column}_lo", f"{column}_hi"
        if lo in frame:
            out[column] = [_fmt(m) + (f" [{_fmt(a)}, {_fmt(b)}]" if not (math.isnan(a) or math.isnan(b)) else "")
                           for m, a, b in zip(frame[column], frame[lo], frame[hi])]
        else:
            out[column] = frame[column]
    return out


def write_report(quality: pd.DataFrame, out: Path, title: str, paired: pd.DataFrame | None = None) -> list[Path]:
    from traces import plots

    out.mkdir(parents=True, exist_ok=True)
    csv = out / schema.QUALITY_CSV
    atomic_writer(csv, lambda tmp: quality.to_csv(tmp, index=False))
    ablation = noise_ablation(quality)
    main = quality[[noise_of(p) in (None, "gumbel") and "selection=" not in p for p in quality["policy"]]]
    untrained = sorted(quality.loc[~quality["trained_model"].astype(bool), "model"].unique())
    text = [f"# {title}\n", METHOD + "\n", "Models: " + ", ".join(sorted(quality["model"].unique())) + ".\n"]
    if untrained:
        text.append(f"**{', '.join(untrained)}: random untrained weights, the numbers test the pipeline only.**\n")
    text += ["## Per policy and cache ratio\n", to_markdown(_cells(main, SHOWN))]
    if paired is not None and not paired.empty:
        atomic_writer(out / "paired.csv", lambda tmp: paired.to_csv(tmp, index=False))
        shown = paired.assign(**{"difference [95% CI]": [f"{_fmt(d)} [{_fmt(a)}, {_fmt(b)}]" for d, a, b in
                                                          zip(paired["difference"], paired["lo"], paired["hi"])]})
        cols = [c for c in ("trace", "comparison", "cache_ratio", "metric", "difference [95% CI]", "n_samples",
                            "n_clusters", "resolved") if c in shown]
        text += ["## Paired difference Keyformer - H2O (same samples)\n",
                 f"`resolved`: the interval excludes 0 and rests on at least {MIN_CLUSTERS} independent clusters "
                 "(with fewer, a percentile bootstrap is too narrow to trust).\n", to_markdown(shown[cols])]
    if not ablation.empty:
        text += ["## Noise ablation (Table 4 analogue)\n", SHIFT_INVARIANCE + "\n",
                 to_markdown(_cells(ablation.assign(policy=ablation["noise"]),
                                    ("rouge2", "rougeL", "self_rougeL", "mass_retained", "ppl", "top1_agreement")))]
        variants = quality[quality["policy"].str.contains("selection=", regex=False)]
        if not variants.empty:
            text += ["### Selection rule variants\n", to_markdown(_cells(variants, SHOWN))]
    md = out / "quality.md"
    atomic_writer(md, lambda tmp: Path(tmp).write_text("\n".join(text)))
    written = [csv, md]
    written += plots.quality_figures(quality, ablation, out, paired)
    return written


def report_folder(trace_dir, refresh_bundled: bool = False) -> Path:
    """Where a trace's own report goes: its quality/ folder, which sweeps read. A bundled trace's
    (traces/data/, tracked files) is rewritten only with --refresh-bundled; otherwise its report goes to
    results/quality/<its path under traces/data>/, so running the tool leaves the checkout clean."""
    from traces.assets import DATA_DIR
    folder = Path(trace_dir)
    try:
        name = folder.resolve().relative_to(DATA_DIR.resolve())
    except ValueError:
        return folder / schema.QUALITY_DIR
    return folder / schema.QUALITY_DIR if refresh_bundled else Path("results") / "quality" / name


def main(argv=None) -> int:
    """The reports; a user mistake is one `error:` line and exit code 2 (kvcommon.cli.run)."""
    return run(_main, argv)


def _main(argv) -> int:
    parser = OneLineParser(prog="python -m traces.quality",
                     description="ROUGE, self-ROUGE, retained attention mass, perplexity per policy x ratio, "
                                 "with bootstrap 95% intervals and paired Keyformer - H2O differences. Each trace's "
                                 "report goes into its quality/ folder (a bundled trace's: results/quality/NAME/).")
    parser.add_argument("dirs", nargs="+", help="trace folders")
    parser.add_argument("--out", help="also write a combined report (csv, md, png) here")
    parser.add_argument("--refresh-bundled", action="store_true",
                        help="rewrite the quality/ reports inside bundled traces (traces/data/, tracked files) "
                             "instead of writing them under results/quality/")
    args = parser.parse_args(argv)
    if args.out is not None:
        check_out_folder("--out", args.out)     # before any scoring
    try:
        frames, pairs, labels = [], [], []
        for folder in args.dirs:
            trace = traces.load(folder)
            samples = per_sample(trace)
            quality = trace_quality(trace, samples)
            paired = paired_differences(samples)
            if not paired.empty:
                paired.insert(0, "trace", quality["trace"].iloc[0])
                paired.insert(0, "model", trace.model["name"])
            target = report_folder(folder, args.refresh_bundled)
            write_report(quality, target,
                         f"Quality: {trace.model['name']} on {trace.manifest['dataset']['name']}", paired)
            frames.append(quality)
            pairs.append(paired)
            labels.append(f"{trace.model['name']} on {trace.manifest['dataset']['name']} ({Path(folder).name})")
            print(target / "quality.md")
        if args.out:
            combined = pd.concat(frames, ignore_index=True)
            write_report(combined, Path(args.out), "Quality: " + "; ".join(labels),
                         pd.concat(pairs, ignore_index=True))
            print(f"{args.out}/quality.md")
    except ImportError as exc:
        raise ValueError(f"{exc} (pip install rouge-score)") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
