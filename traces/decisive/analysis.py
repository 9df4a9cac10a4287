"""`python -m traces.decisive.analysis --cnndm DIR --xsum DIR --out DIR`: the pre-registered tests of
docs/traces.md ("Pre-registered experiment") on the captured traces, torch-free.

Every comparison is paired per article: d_i = a_i - b_i for one metric at one cache ratio, a and b two
policy labels of the same trace (Keyformer = the per-article mean over its three noise seeds, as
traces.quality.per_sample gives it). The test is a two-sided sign-flip (permutation) test of mean(d) = 0:
exact over all 2^n sign patterns up to n = 16, else `N_FLIPS` seeded random patterns, p = (hits + 1) /
(flips + 1). The effect is 100 * mean(d) / mean(full) ("% of full", full = the full cache's mean of the
metric on the same articles; top-1 agreement is already a share of full, so its effect is in points), with a
95% percentile-bootstrap interval over articles (the ratio recomputed in each resample). The primary
comparison is tested alone at alpha = 0.05; the secondary family is Holm-corrected. The upper end of the
primary interval is the smallest Keyformer advantage the data rule out (any larger one lies outside it)."""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvcommon.cli import OneLineParser, atomic_write_text, run

N_FLIPS = 100_000
N_BOOT = 10_000
SEED = 0
ALPHA = 0.05
EXACT_UP_TO = 16
FULL = "full"
KEYFORMER, H2O = "keyformer", "h2o"
H2O_HALF = "h2o(recent_ratio=0.5)"
OFFICIAL = "keyformer(selection=official)"
RATIOS = (0.2, 0.3, 0.5)


@dataclass(frozen=True)
class Comparison:
    dataset: str  # "cnndm" | "xsum"
    metric: str  # a per_sample column: rouge2, nll, top1_agreement
    ratio: float
    a: str
    b: str
    primary: bool = False


def plan() -> list[Comparison]:
    """The pre-registered comparisons: the primary first, then the secondary (Holm) family."""
    out = [Comparison("cnndm", "rouge2", 0.3, KEYFORMER, H2O, primary=True)]
    out += [Comparison("cnndm", "rouge2", r, KEYFORMER, H2O) for r in RATIOS if r != 0.3]
    out += [Comparison("cnndm", "rouge2", r, KEYFORMER, H2O_HALF) for r in RATIOS]
    out += [Comparison("cnndm", "rouge2", r, OFFICIAL, H2O) for r in RATIOS]
    out += [Comparison("xsum", m, r, KEYFORMER, H2O) for m in ("nll", "top1_agreement") for r in RATIOS]
    return out


def sign_flip_p(d, n_flips: int = N_FLIPS, seed: int = SEED) -> float:
    """Two-sided p of mean(d) = 0 under random signs (exact for small n)."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return float("nan")
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, observed)
    if d.size <= EXACT_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
        return float(np.mean(np.abs(signs @ d) / d.size >= observed - tol))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_flips, 10_000):
        signs = rng.choice((-1.0, 1.0), size=(min(10_000, n_flips - start), d.size))
        hits += int((np.abs(signs @ d) / d.size >= observed - tol).sum())
    return (hits + 1) / (n_flips + 1)


def holm(pvalues) -> np.ndarray:
    """Holm-adjusted p-values (step-down, monotone, capped at 1), in the input order."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def pct_of_full(a, b, full, points: bool, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[float, float, float]:
    """100 mean(a - b) / mean(full) (points: 100 mean(a - b)) with its 95% bootstrap interval over articles."""
    a, b, full = (np.asarray(x, dtype=float) for x in (a, b, full))
    d = a - b

    def effect(index):
        diff = d[index].mean(axis=-1)
        return 100.0 * diff if points else 100.0 * diff / full[index].mean(axis=-1)
    whole = np.arange(d.size)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, d.size, size=(n_boot, d.size))
    resampled = effect(draws)
    lo, hi = np.percentile(resampled, [2.5, 97.5])
    return float(effect(whole)), float(lo), float(hi)


def paired(samples: pd.DataFrame, comparison: Comparison) -> pd.DataFrame:
    """Per article: a, b and full for the comparison's metric (articles all three have)."""
    rows = samples.assign(cache_ratio=samples["cache_ratio"].astype(float).round(4))

    def column(label, ratio):
        part = rows[(rows["policy"] == label) & (rows["cache_ratio"] == ratio)]
        return part.set_index("sample")[comparison.metric]
    table = pd.DataFrame({"a": column(comparison.a, comparison.ratio), "b": column(comparison.b, comparison.ratio),
                          "full": column(FULL, 1.0)})
    if comparison.metric == "top1_agreement":
        table["full"] = 1.0
    return table.dropna()


def evaluate(per_dataset: dict[str, pd.DataFrame], comparisons: list[Comparison] | None = None) -> pd.DataFrame:
    """One row per comparison: n, mean difference, effect in % of full with its interval, p, Holm p."""
    rows = []
    for c in comparisons or plan():
        if c.dataset not in per_dataset:
            continue
        table = paired(per_dataset[c.dataset], c)
        if table.empty:
            raise ValueError(f"{c.dataset}: no articles with {c.a}, {c.b} and {FULL} for {c.metric} at {c.ratio}")
        effect, lo, hi = pct_of_full(table["a"], table["b"], table["full"], points=c.metric == "top1_agreement")
        rows.append({"dataset": c.dataset, "metric": c.metric, "cache_ratio": c.ratio, "a": c.a, "b": c.b,
                     "primary": c.primary, "n": len(table), "mean_a": table["a"].mean(), "mean_b": table["b"].mean(),
                     "mean_full": table["full"].mean(), "mean_diff": (table["a"] - table["b"]).mean(),
                     "pct_of_full": effect, "pct_lo": lo, "pct_hi": hi,
                     "p": sign_flip_p(table["a"] - table["b"])})
    frame = pd.DataFrame(rows)
    frame["p_holm"] = np.nan
    secondary = ~frame["primary"]
    if secondary.any():
        frame.loc[secondary, "p_holm"] = holm(frame.loc[secondary, "p"])
    frame.loc[frame["primary"], "p_holm"] = frame.loc[frame["primary"], "p"]
    frame["significant"] = frame["p_holm"] < ALPHA
    return frame


def to_markdown(frame: pd.DataFrame) -> str:
    lines = ["| dataset | metric | ratio | a - b | n | a | b | full | effect, % of full [95% CI] | p | Holm p |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.itertuples(index=False):
        mark = " (primary)" if r.primary else ""
        lines.append(f"| {r.dataset} | {r.metric}{mark} | {r.cache_ratio:g} | {r.a} - {r.b} | {r.n} | {r.mean_a:.4g} | "
                     f"{r.mean_b:.4g} | {r.mean_full:.4g} | {r.pct_of_full:+.2f} [{r.pct_lo:+.2f}, {r.pct_hi:+.2f}] | "
                     f"{r.p:.4f} | {r.p_holm:.4f} |")
    primary = frame[frame["primary"]]
    if not primary.empty:
        r = primary.iloc[0]
        verdict = ("Keyformer's ROUGE-2 differs from H2O's" if r.significant else "no difference resolved")
        lines += ["", f"Primary: {verdict} (p = {r.p:.4f}); Keyformer advantages above {r.pct_hi:+.2f}% of full "
                      f"ROUGE-2 are ruled out at 95% ({r.n} articles)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m traces.decisive.analysis", description=__doc__.splitlines()[0])
    parser.add_argument("--cnndm", help="the CNN/DailyMail trace folder")
    parser.add_argument("--xsum", help="the XSum teacher-forced trace folder")
    parser.add_argument("--out", required=True, help="folder for tests.csv and report.md")
    parser.add_argument("--primary-only", action="store_true",
                        help="the primary comparison alone (a subset run: another model, fewer policies)")
    args = parser.parse_args(argv)
    if not (args.cnndm or args.xsum):
        parser.error("give --cnndm and/or --xsum")
    import traces
    from traces.quality import per_sample

    loaded = {name: traces.load(folder) for name, folder in (("cnndm", args.cnndm), ("xsum", args.xsum)) if folder}
    per_dataset = {name: per_sample(trace) for name, trace in loaded.items()}
    frame = evaluate(per_dataset, plan()[:1] if args.primary_only else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "tests.csv", frame.to_csv(index=False))
    model = next(iter(loaded.values())).model.get("name", "?")
    title = "the primary comparison" if args.primary_only else "the pre-registered tests"
    atomic_write_text(out / "report.md", f"# Keyformer vs H2O: {title} ({model})\n\n" + to_markdown(frame))
    print(to_markdown(frame))
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
