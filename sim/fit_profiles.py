"""`python -m sim.fit_profiles`: fit the GPU engine profiles' named terms to published measurements.

    python -m sim.fit_profiles                                   # default CSV, writes the shipped file
    python -m sim.fit_profiles --csv ../shared/data/gpu-published-train.csv \
        --out sim/engine_profiles/gpu-published-fit.yaml

Reads the CSV (sim/validation/published_gpu.py: default `../shared/data/gpu-published-train.csv`, or
KVSIM_DATA), keeps the single-device rows (tp = 1; multi-GPU rows are out of scope for the one-device
model and are listed as excluded), and fits the terms of sim/profiles/engines.py (TERMS: a handful, each
bounded to a physical range, shared by every device) by bounded robust least squares (soft-L1) on
log(predicted / measured), from the priors and a few attention-rate starts. Every row is predicted through the engine as it is now, so the
fit is re-run on top of whatever the engine's op costs are (the file records the fit's date and the
predictions it saw, and `sim.validate` warns when the engine has moved since).

Leave-one-source-out (LOSO): for every source (a vendor document) the terms are fitted again without
its rows and its rows are predicted with those terms; the file keeps each fold's terms so
`python -m sim.validate` can show LOSO error beside in-sample error.

An engine with no single-device rows in the CSV (vLLM here: its only rows are 8-GPU) is not fitted: its
terms are copied from the fitted engine and marked `fitted: false` with the reason.
"""
from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

import numpy as np
import yaml

from sim import bounded_fit as bf
from sim.cli import OneLineParser, atomic_write_text, output_file, run
from sim.profiles import engines as pe
from sim.validation import published_gpu as pg

DEFAULT_OUT = pe.FIT_FILE
FITTED_ENGINE = "trtllm"
MAX_ITER = 40


def _values(z) -> dict[str, float]:
    return bf.values(z, pe.TERMS)


def predictions(rows, values: dict, engine_name: str = FITTED_ENGINE) -> np.ndarray:
    profile = pe.make_profile(engine_name, values, name=f"{engine_name}-fit")
    return np.array([pg.predict_row(r, profile) for r in rows])


# Robust loss: soft-L1 on the log error with a 5% knee (quadratic below, linear above), so a few rows the
# physics cannot reach (e.g. an older engine version's kernels) do not drag the shared terms to the edge
# of their ranges. Least squares runs on sign(r) * sqrt(rho(r)), whose squares sum to the loss.
LOSS_SCALE = 0.05


# A faint pull towards the priors (in the logistic coordinates): a term the rows do not constrain (e.g. the
# per-head attention rate when no row runs that kernel) stays at its prior instead of wherever a start put it.
PRIOR_WEIGHT = 1e-2


def _residuals(rows, measured, z):
    r = np.log(predictions(rows, _values(z)) / measured)
    rho = 2.0 * (np.sqrt(1.0 + (r / LOSS_SCALE) ** 2) - 1.0) * LOSS_SCALE ** 2
    pull = PRIOR_WEIGHT * (z - bf.to_z([pe.prior_values()[n] for n in pe.TERM_NAMES], pe.TERMS))
    return np.concatenate([np.sign(r) * np.sqrt(rho), pull])


def fit_terms(rows, start: dict | None = None) -> dict[str, float]:
    """Bounded least squares (Levenberg-Marquardt in a logistic reparametrisation of each term's
    bounds) on log(predicted / measured); deterministic. Without `start`: from the priors and from the
    middle of every term's range, keeping the better (priors at a bound leave terms the rows barely
    see at first stuck there)."""
    if not rows:
        raise ValueError("no rows to fit")
    if start is not None:
        return _descend(rows, bf.to_z([start[n] for n in pe.TERM_NAMES], pe.TERMS))[1]
    fits = [_descend(rows, z0) for z0 in start_points()]
    return min(fits, key=lambda f: f[0])[1]


# The decode-attention rate has two basins on the published rows (compute-bound Mistral rows explained by
# the attention kernel, or by overheads): descend from the priors and from the middle of every range with
# the attention rate at a few levels of its range, keep the best. Every LOSO fold runs the same starts.
ATTENTION_STARTS = (0.05, 0.15, 0.4)


def start_points() -> list[np.ndarray]:
    prior = pe.prior_values()
    starts = [bf.to_z([prior[n] for n in pe.TERM_NAMES], pe.TERMS)]
    for level in ATTENTION_STARTS:     # overheads at their priors, efficiencies inside their ranges
        x = dict(prior, gemm_eff=0.8, fp8_gemm_eff=0.8, attn_fp8_kv_eff=0.8, attn_core_eff=level)
        starts.append(bf.to_z([x[n] for n in pe.TERM_NAMES], pe.TERMS))
    return starts


def _descend(rows, z) -> tuple[float, dict[str, float]]:
    measured = np.array([r.value for r in rows])
    cost, z = bf.descend(lambda zz: _residuals(rows, measured, zz), z, MAX_ITER)
    return cost, _values(z)


# What a fold's training rows leave open: for each term, scanned over its physical range with the other
# terms at the fold's values, the values the training rows cannot tell apart (their MAPE within
# ACCEPT_PT points of the fold's own) and how far the left-out rows' predictions move over those values.
# A large move means the left-out source's LOSO error is set by a term only that source measures, not
# by a misfit of the others.
ACCEPT_PT = 0.5
SCAN_POINTS = 11


def open_terms(train, held, values: dict) -> dict[str, dict]:
    """Per term: `accepted` [lowest, highest] value the training rows accept, `held_out_move_pct` the largest
    change of a left-out row's prediction over them (%)."""
    measured = np.array([r.value for r in train])
    limit = bf.mape(predictions(train, values), measured) + ACCEPT_PT
    base = predictions(held, values)
    out = {}
    for t in pe.TERMS:
        accepted, move = [values[t.name]], 0.0
        for u in np.linspace(0.0, 1.0, SCAN_POINTS):
            trial = {**values, t.name: t.lo + u * (t.hi - t.lo)}
            if bf.mape(predictions(train, trial), measured) <= limit:
                accepted.append(trial[t.name])
                move = max(move, float(np.max(np.abs(predictions(held, trial) / base - 1.0))))
        out[t.name] = {"accepted": [round(float(min(accepted)), 9), round(float(max(accepted)), 9)],
                       "held_out_move_pct": round(100.0 * move, 2)}
    return out


def run_fit(csv: Path) -> dict:
    rows = pg.load_rows(csv)
    fit_rows = pg.in_scope(rows, FITTED_ENGINE)
    if len(fit_rows) < len(pe.TERMS) + 1:
        raise ValueError(f"{csv}: {len(fit_rows)} single-device {FITTED_ENGINE} rows, need more than "
                         f"{len(pe.TERMS)} (one per term)")
    measured = np.array([r.value for r in fit_rows])
    terms = fit_terms(fit_rows)
    in_sample = predictions(fit_rows, terms)
    folds, loso_pred, left_open = {}, np.empty(len(fit_rows)), {}
    sources = list(dict.fromkeys(r.source for r in fit_rows))
    for source in sources:
        train = [r for r in fit_rows if r.source != source]
        fold = fit_terms(train)          # the same starts as the full fit: nothing of the held-out rows
        folds[source] = {k: round(v, 9) for k, v in fold.items()}
        idx = [i for i, r in enumerate(fit_rows) if r.source == source]
        held = [fit_rows[i] for i in idx]
        loso_pred[idx] = predictions(held, fold)
        left_open[source] = open_terms(train, held, fold)
    return dict(rows=rows, fit_rows=fit_rows, measured=measured, terms=terms, in_sample=in_sample, folds=folds,
                loso=loso_pred, left_open=left_open)


def _term_entries(values: dict, source: str) -> dict:
    return {t.name: {"value": round(values[t.name], 9), "unit": t.unit, "bounds": [t.lo, t.hi],
                     "prior": t.prior, "prior_source": t.prior_source, "meaning": t.meaning, "source": source}
            for t in pe.TERMS}


def build_document(result: dict, csv: Path, command: str) -> dict:
    fit_rows, rows = result["fit_rows"], result["rows"]
    csv_label = pg.display_path(csv)
    fitted_source = (f"fitted by `{command}` to {len(fit_rows)} single-device {FITTED_ENGINE} rows of {csv_label} "
                     f"(sha256 {pg.file_sha256(csv)[:16]})")
    engines = {FITTED_ENGINE: {"fitted": True, "rows": len(fit_rows), "terms": _term_entries(result["terms"], fitted_source),
                               "loso_folds": result["folds"],
                               # per fold and term: the values its training rows accept and how far the
                               # left-out rows move over them (open_terms)
                               "loso_open_terms": result["left_open"]}}
    for engine_name in pe.ENGINES:
        if engine_name == FITTED_ENGINE:
            continue
        own = pg.in_scope(rows, engine_name)
        reason = (f"not fitted: {csv_label} has {len(own)} single-device {engine_name} rows "
                  f"({sum(r.engine == engine_name for r in rows)} in all, multi-GPU); values copied from the "
                  f"{FITTED_ENGINE} fit (same devices and kernel classes: an assumption, not a measurement)")
        engines[engine_name] = {"fitted": False, "rows": len(own), "reason": reason,
                                "terms": _term_entries(result["terms"], reason)}
    excluded = [{"row": r.index, "id": r.id, "why": r.scope} for r in rows if r.scope != "single-device"]
    per_row = [{"row": r.index, "id": r.id, "source": r.source, "regime": r.regime, "measured": r.value,
                "in_sample": round(float(p), 6), "loso": round(float(q), 6)}
               for r, p, q in zip(fit_rows, result["in_sample"], result["loso"])]
    return {
        "schema_version": 1,
        "kind": "kvsim-engine-profiles",
        "fit": {"command": command, "csv": csv_label, "csv_sha256": pg.file_sha256(csv),
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "objective": "soft-L1 loss (5% knee) on log(predicted / measured), terms bounded (logistic "
                             "reparametrisation), Levenberg-Marquardt from the priors and 3 attention-rate starts",
                "rows_fitted": len(fit_rows), "rows_excluded": excluded,
                "open_terms": {"accept_pt": ACCEPT_PT, "scan_points": SCAN_POINTS,
                               "what": "per LOSO fold and term: the values the fold's training rows accept (MAPE "
                                       "within accept_pt points of the fold's, other terms held) and the largest move "
                                       "of a left-out row's prediction over them (engines.trtllm.loso_open_terms)"},
                "in_sample_mape_pct": round(bf.mape(result["in_sample"], result["measured"]), 3),
                "loso_mape_pct": round(bf.mape(result["loso"], result["measured"]), 3)},
        "engines": engines,
        "predictions": per_row,
    }


def write_document(doc: dict, out: Path) -> None:
    header = ("# Engine profiles fitted to published GPU measurements: written by python -m sim.fit_profiles\n"
              "# (do not edit by hand; re-run the command in `fit.command`). Terms: sim/profiles/engines.py.\n")
    atomic_write_text(out, header + yaml.safe_dump(doc, sort_keys=False, width=120))


def build_parser():
    p = OneLineParser(prog="python -m sim.fit_profiles",
                      description="Fit the trtllm/vllm engine profiles' terms to published GPU measurements.")
    p.add_argument("--csv", type=Path, default=None,
                   help=f"published measurements (default: {pg.display_path(pg.default_csv())}, or $KVSIM_DATA/"
                        f"{pg.CSV_NAME})")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"profile file to write (default: {pg.display_path(DEFAULT_OUT)})")
    p.add_argument("--quiet", action="store_true", help="no summary on stdout")
    return p


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    csv = args.csv if args.csv is not None else pg.default_csv()
    output_file("--out", args.out)
    result = run_fit(csv)
    command = "python -m sim.fit_profiles --csv " + pg.display_path(csv)
    if args.out.resolve() != DEFAULT_OUT.resolve():
        command += " --out " + pg.display_path(args.out)
    doc = build_document(result, csv, command)
    write_document(doc, args.out)
    if not args.quiet:
        fit = doc["fit"]
        terms = ", ".join(f"{k}={v['value']:.4g}" for k, v in doc["engines"][FITTED_ENGINE]["terms"].items())
        print(f"{fit['rows_fitted']} rows: in-sample MAPE {fit['in_sample_mape_pct']:.1f}%, "
              f"LOSO MAPE {fit['loso_mape_pct']:.1f}%; {terms}: {args.out}")
    return 0


def main(argv=None) -> int:
    """User mistakes (bad flags, a missing CSV, too few rows) are one `error: ...` line and exit code 2."""
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
