"""`python -m traces.window_check TRACE...`: every kept-position step of a full-detail trace checked against
the budget and recent-window rules, re-derived here from the manifest's policy parameters (not from the
policy code that produced the trace).

For a fixed-budget policy with a recent window (h2o, keyformer, window; budget_base "real"), prompt of n
real tokens, cache ratio p, recent ratio r (keyformer/base.py's conventions):
  paper selection     k = max(1, floor(p n)), w = min(floor(r k), k); after step s (s = -1: the prefill) a
                      KV head holds min(n + s + 1, k) positions, the w newest among them.
  official selection  k = max(1, int(n P / 100)), w = min(int(k R / 100), k) with P = 100 p, R = 100 r (the
                      released scripts' percentages); a head holds min(n + s + 1, k - 1) positions, the w - 1
                      newest among them (the incoming token is the window's w-th).
A window violation is a step where one of those newest positions is missing; a budget violation one where the
count differs. Other policies (variable lengths, no window) and padded budgets are listed as not checked.
Writes TRACE-name.csv per trace and window-check.md under --out (default results/window-check/report).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvcommon.cli import OneLineParser, atomic_write_text, check_out_folder, positive_int, run
from traces.reader import TraceError, load

CHECKED = ("h2o", "keyformer", "window")


def _percent(n: int, ratio: float) -> int:
    """int(n * P / 100) with P = 100 * ratio as a percentage (the released scripts' rounding)."""
    return int(math.floor(n * round(ratio * 100.0, 9) / 100.0))


def rules(params: dict, name: str, n: int, cache_ratio: float) -> tuple[int, int] | None:
    """(positions a head holds once full, newest positions it must hold), or None when not checked."""
    if name not in CHECKED or params.get("budget_base", "real") != "real":
        return None
    r = float(params.get("recent_ratio", 0.0))
    if params.get("selection", "paper") == "official":
        k = max(1, _percent(n, cache_ratio))
        w = min(_percent(k, r), k)
        return k - 1, max(w - 1, 0)
    k = max(1, int(math.floor(cache_ratio * n)))
    return k, min(int(math.floor(r * k)), k)


COLUMNS = ("policy", "cache_ratio", "head_steps", "window_violations", "budget_violations", "samples")


def _replay(head: pd.DataFrame, n: int, hold: int, newest: int) -> tuple[int, int, int]:
    """(steps, window violations, budget violations) of one KV head's kept rows, in step order."""
    held: set = set()
    steps = window = budget = 0
    for step, bitmap, added, evicted in zip(head["step"], head["kept_bitmap"], head["added"], head["evicted"]):
        if step == -1:
            held = set(np.flatnonzero(np.unpackbits(np.frombuffer(bitmap, np.uint8))[:n]).tolist())
        else:
            held.update(int(p) for p in added)
            held.difference_update(int(p) for p in evicted)
        last = n + int(step)                    # the newest position that exists after the step
        steps += 1
        budget += len(held) != min(last + 1, hold)
        window += any(p not in held for p in range(last - newest + 1, last + 1))
    return steps, window, budget


def check_trace(trace, samples: int | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Per policy x cache ratio of a loaded trace: head-steps checked, window and budget violations, samples;
    and the labels not checked with their reason. `samples`: the first that many samples only."""
    if trace.manifest.get("detail", "full") != "full":
        raise TraceError(f"{trace.path}: a --detail summary trace has no kept positions (capture with --detail full)")
    variants = trace.manifest.get("policy", {}).get("variants", {})
    prompt = trace.kv.groupby("sample")["prompt_len"].first().to_dict()
    kept = trace.kept
    if samples is not None:
        kept = kept[kept["sample"].isin(trace.samples[:samples])]
    kept = kept.sort_values(["policy", "cache_ratio", "sample", "layer", "head", "step"])
    rows, skipped = [], []
    for (label, ratio), group in kept.groupby(["policy", "cache_ratio"], sort=True):
        spec = variants.get(label, {})
        name, params = spec.get("name", label), spec.get("params", {})
        ratio = round(float(ratio), 4)
        if rules(params, name, 1, ratio) is None:
            skipped.append(f"{label} @ {ratio:g} (" + ("a padded budget base" if name in CHECKED else
                                                      "not one of " + ", ".join(CHECKED)) + ")")
            continue
        totals = np.zeros(3, dtype=np.int64)
        for (sample, _layer, _head), head in group.groupby(["sample", "layer", "head"], sort=False):
            n = int(prompt[sample])
            totals += _replay(head, n, *rules(params, name, n, ratio))
        rows.append((label, ratio, *(int(t) for t in totals), group["sample"].nunique()))
    return pd.DataFrame(rows, columns=list(COLUMNS)), skipped


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m traces.window_check", description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="trace folders captured with --detail full")
    p.add_argument("--out", default="results/window-check/report", help="folder for the CSVs and window-check.md")
    p.add_argument("--samples", type=positive_int, default=None, help="check the first N samples of each trace only")
    args = p.parse_args(argv)
    out = check_out_folder("--out", args.out)
    results = [(trace, *check_trace(trace, args.samples)) for trace in (load(t) for t in args.traces)]
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Recent-window and budget check of kept positions", "",
             "`python -m traces.window_check " + " ".join(args.traces) + "` (rules: traces/window_check.py)", ""]
    bad = 0
    for trace, table, skipped in results:
        name = Path(trace.path).name
        atomic_write_text(out / f"{name}.csv", table.to_csv(index=False))
        lines += [f"## {name} ({trace.model.get('name', '?')})", "", "| policy | cache ratio | samples | head-steps "
                  "| window violations | budget violations |", "|---|---|---|---|---|---|"]
        lines += [f"| {r.policy} | {r.cache_ratio:g} | {r.samples} | {r.head_steps:,} | {r.window_violations} | "
                  f"{r.budget_violations} |" for r in table.itertuples()]
        lines += [""] + ([f"Not checked: {'; '.join(skipped)}.", ""] if skipped else [])
        steps, window, budget = (int(table[c].sum()) for c in ("head_steps", "window_violations", "budget_violations"))
        bad += window + budget
        print(f"{trace.path}: {steps:,} head-steps, {window} window and {budget} budget violations")
    atomic_write_text(out / "window-check.md", "\n".join(lines))
    print(f"report: {out / 'window-check.md'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run(main))
