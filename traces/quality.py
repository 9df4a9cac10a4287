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

from hwmodels.cli import OneLineParser, atomic_writer

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
    """'gumbel' for plain keyformer, the noise parameter of a keyformer variant, None otherwise."""
    if label == "keyformer":
        return "gumbel"
    match = re.fullmatch(r"keyformer\((.*)\)", label)
    if not match:
        return None
    params = dict(p.split("=", 1) for p in match.group(1).split(",") if "=" in p)
    return params.get("noise") if set(params) == {"noise"} else None


def trace_quality(trace: traces.Trace) -> pd.DataFrame:
    """One row per policy x cache ratio of one trace."""
    scorer = _scorer()
    texts = trace.texts.copy()
    texts["cache_ratio"] = texts["cache_ratio"].astype(float).round(4)
    teacher_forced = trace.manifest["dataset"].get("mode") == "teacher_forced"
    full = texts[texts["policy"] == FULL].set_index("sample")["generated"].to_dict()

    per_run = []
    for rec in texts.itertuples(index=False):
        row = {"policy": rec.policy, "cache_ratio": rec.cache_ratio, "sample": rec.sample}
        if not teacher_forced:
            row.update(_rouge(scorer, rec.generated, rec.reference or ""))
            if rec.sample in full:
                if rec.generated == full[rec.sample]:  # identical (also when both are empty)
                    row.update({f"self_{k}": 100.0 for k in ROUGE_KEYS})
                else:
                    row.update({f"self_{k}": v for k, v in _rouge(scorer, rec.generated, full[rec.sample]).items()})
        per_run.append(row)
    per_run = pd.DataFrame(per_run)

    kv = trace.kv.assign(cache_ratio=trace.kv["cache_ratio"].astype(float).round(4))
    kv = kv.assign(kept_fraction=kv["kv_len"] / (kv["prompt_len"] + kv["step"] + 1))
    mass = kv.groupby(["policy", "cache_ratio"]).agg(mass_retained=("mass_retained", "mean"),
                                                    mass_retained_min=("mass_retained", "min"),
                                                    kept_fraction=("kept_fraction", "mean"))
    metric_cols = [c for c in per_run.columns if c not in ("policy", "cache_ratio", "sample")]
    out = per_run.groupby(["policy", "cache_ratio"]).agg(
        n_samples=("sample", "nunique"), **{c: (c, "mean") for c in metric_cols})
    out = out.join(mass)

    steps = trace.steps.assign(cache_ratio=trace.steps["cache_ratio"].astype(float).round(4))
    if teacher_forced:
        nll = steps.groupby(["policy", "cache_ratio"])["nll"].mean()
        out["ppl"] = np.exp(nll)
        full_steps = steps[steps["policy"] == FULL].set_index(["sample", "step"])["top1"]
        if not full_steps.empty:
            out["ppl_ratio"] = out["ppl"] / float(np.exp(steps.loc[steps["policy"] == FULL, "nll"].mean()))
            joined = steps.join(full_steps.rename("full_top1"), on=["sample", "step"])
            agree = (joined["top1"] == joined["full_top1"]).groupby([joined["policy"], joined["cache_ratio"]]).mean()
            out["top1_agreement"] = agree
    decode = steps[steps["phase"] == "decode"]
    out["decode_ms"] = decode.groupby(["policy", "cache_ratio"])["wall_s"].median() * 1e3
    out = out.reset_index()

    if "rouge2" in out and (out["policy"] == FULL).any():
        full_r2 = float(out.loc[out["policy"] == FULL, "rouge2"].iloc[0])
        out["rouge2_pct_full"] = 100.0 * out["rouge2"] / full_r2 if full_r2 > 0 else math.nan
    out.insert(0, "trace", f"{trace.path.resolve().parent.name}/{trace.path.resolve().name}")
    out.insert(0, "dataset", trace.manifest["dataset"]["name"])
    out.insert(0, "model", trace.model["name"])
    out["trained_model"] = trace.model.get("trained", True)
    return out.sort_values(["policy", "cache_ratio"]).reset_index(drop=True)


def noise_ablation(quality: pd.DataFrame) -> pd.DataFrame:
    """Table 4 analogue: keyformer noise variants at the cache ratio(s) they share."""
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


def write_report(quality: pd.DataFrame, out: Path, title: str) -> list[Path]:
    from traces import plots

    out.mkdir(parents=True, exist_ok=True)
    csv = out / schema.QUALITY_CSV
    atomic_writer(csv, lambda tmp: quality.to_csv(tmp, index=False))
    ablation = noise_ablation(quality)
    main = quality[[noise_of(p) in (None, "gumbel") for p in quality["policy"]]]  # variants go to the ablation
    shown = [c for c in ("model", "dataset", "trace", "policy", "cache_ratio", "n_samples", "rouge1", "rouge2", "rougeL",
                         "rouge2_pct_full", "self_rougeL", "mass_retained", "kept_fraction", "ppl", "ppl_ratio",
                         "top1_agreement", "decode_ms") if c in main]
    untrained = sorted(quality.loc[~quality["trained_model"].astype(bool), "model"].unique())
    text = [f"# {title}\n",
            "ROUGE F1 x100 (rouge-score, stemmed) against the references; self_rougeL against the full-cache "
            "output of the same sample; mass_retained = share of full-cache attention on the kept tokens. "
            "Models: " + ", ".join(sorted(quality["model"].unique())) + ".\n"]
    if untrained:
        text.append(f"**{', '.join(untrained)}: random untrained weights, the numbers test the pipeline only.**\n")
    text += ["## Per policy and cache ratio\n", to_markdown(main[shown])]
    if not ablation.empty:
        text += ["## Noise ablation (Table 4 analogue)\n", to_markdown(ablation)]
    md = out / "quality.md"
    md.write_text("\n".join(text))
    written = [csv, md]
    written += plots.quality_figures(quality, ablation, out)
    return written


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m traces.quality",
                     description="ROUGE, self-ROUGE, retained attention mass, perplexity per policy x ratio.")
    parser.add_argument("dirs", nargs="+", help="trace folders")
    parser.add_argument("--out", help="also write a combined report (csv, md, png) here")
    args = parser.parse_args(argv)
    try:
        frames, labels = [], []
        for folder in args.dirs:
            trace = traces.load(folder)
            quality = trace_quality(trace)
            write_report(quality, Path(folder) / schema.QUALITY_DIR,
                         f"Quality: {trace.model['name']} on {trace.manifest['dataset']['name']}")
            frames.append(quality)
            labels.append(f"{trace.model['name']} on {trace.manifest['dataset']['name']} ({Path(folder).name})")
            print(f"{folder}/{schema.QUALITY_DIR}/quality.md")
        if args.out:
            combined = pd.concat(frames, ignore_index=True)
            write_report(combined, Path(args.out), "Quality: " + "; ".join(labels))
            print(f"{args.out}/quality.md")
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"error: {exc} (pip install rouge-score)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
