"""`python -m sim.fit_hf`: fit the `hf-fit` profile's CPU term (sim/profiles/hf_fit.py) to the
project's own plain transformers decode steps, and check them leave-one-shape-out.

    python -m sim.fit_hf                       # the bundled traces/data/cpu-hf-sdpa folders -> results/fit-hf/
    python -m sim.fit_hf --update-shipped      # the same, refreshing sim/engine_profiles/hf-cpu-fit.yaml
    python -m sim.fit_hf --measured DIR [...] --out FILE.yaml

Reads the timing folders measured with `traces.timing --stack hf --attn sdpa --beams 1` (manifest
software `hf`; every one must name the same hardware file: the term describes that machine), fits
stream_fraction by bounded least squares on log(predicted / measured) over every decode
point, and again once per model shape without that shape's points (leave-one-shape-out, LOSO: the
shapes are GPT-2 small, a Llama-shaped GQA model and a wide multi-head model, so each fold predicts a
model it never saw). The hardware file itself is fitted to microbenchmarks only (hwmodels.calibrate):
no decode step is among its inputs. Writes the terms, the folds, each point's in-sample and LOSO
prediction and the hardware file's content hash (sim/engine_profiles/hf-cpu-fit.yaml by default).
"""
from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

import numpy as np
import yaml

from sim.cli import OneLineParser, atomic_write_text, output_file, run
from sim import bounded_fit as bf
from sim.models import load_model
from sim.profiles import hf_fit as hff
from sim.validation import predict as vp
from sim.validation.measured import DATA_DIR, find_timing_folders, load_timing

DEFAULT_FOLDERS = ("cpu-hf-sdpa",)
MAX_ITER = 30


def load_points(folders=None) -> tuple[list[dict], str, str]:
    """Decode points of the hf (SDPA, greedy) timing folders; (points, hardware path, its content hash)."""
    roots = [Path(f) for f in folders] if folders else [DATA_DIR / d for d in DEFAULT_FOLDERS]
    missing = [str(r) for r in roots if not r.exists()]
    if missing:
        raise FileNotFoundError(f"no such folder: {missing[0]}")
    points, hw = [], None
    for path in find_timing_folders(roots):
        source = load_timing(path)
        if source.profile != "hf":
            continue
        if hw is not None and source.hw != hw:
            raise ValueError(f"{path}: predicted on {source.hw}, the others on {hw}: one fit describes one machine")
        hw = source.hw
        model = load_model(source.model_config)
        for _, t in source.table[source.table["phase"] == "decode"].iterrows():
            points.append(dict(id=f"{source.name}/b{int(t['batch'])}/n{int(t['context'])}", shape=model.name, model=model,
                               batch=int(t["batch"]), slots=float(t["slots"]), policy=str(t["policy"]),
                               dtype=source.dtype, measured=float(t["median_s"])))
    if not points:
        raise ValueError("no hf decode points in " + ", ".join(map(str, roots)))
    if len({p["shape"] for p in points}) < 2:
        raise ValueError("leave-one-shape-out needs points of at least two model shapes")
    return points, hw, vp._device(hw).content_hash


def predictions(points, values: dict, hw: str, device_hash: str) -> np.ndarray:
    profile = hff.make_profile(values, device_hash, name="hf-fit-trial")
    return np.array([vp.decode_step_s(hw, p["model"], p["batch"], p["slots"], p["policy"], p["dtype"], profile)
                     for p in points])


def fit_terms(points, hw: str, device_hash: str) -> dict:
    """Levenberg-Marquardt on log(predicted / measured) in a logistic reparametrisation of the bounds,
    from the priors (the unfitted hf); deterministic."""
    measured = np.array([p["measured"] for p in points])

    def residuals(z):
        return np.log(predictions(points, bf.values(z, hff.TERMS), hw, device_hash) / measured)

    _, z = bf.descend(residuals, bf.to_z([t.prior for t in hff.TERMS], hff.TERMS), MAX_ITER)
    return bf.values(z, hff.TERMS)


def run_fit(folders=None) -> dict:
    points, hw, device_hash = load_points(folders)
    measured = np.array([p["measured"] for p in points])
    terms = fit_terms(points, hw, device_hash)
    in_sample = predictions(points, terms, hw, device_hash)
    unfitted = predictions(points, {t.name: t.prior for t in hff.TERMS}, hw, device_hash)
    folds, loso = {}, np.empty(len(points))
    for shape in dict.fromkeys(p["shape"] for p in points):
        train = [p for p in points if p["shape"] != shape]
        idx = [i for i, p in enumerate(points) if p["shape"] == shape]
        folds[shape] = fit_terms(train, hw, device_hash)
        loso[idx] = predictions([points[i] for i in idx], folds[shape], hw, device_hash)
    return dict(points=points, hw=hw, device_hash=device_hash, measured=measured, terms=terms, in_sample=in_sample,
                loso=loso, unfitted=unfitted, folds=folds)


def _rel(path) -> str:
    from sim.validation.analysis import repo_relative
    return repo_relative(path)


def build_document(result: dict, command: str) -> dict:
    m = result["measured"]
    per_shape = {}
    for shape in result["folds"]:
        idx = [i for i, p in enumerate(result["points"]) if p["shape"] == shape]
        per_shape[shape] = {"points": len(idx), "in_sample_mape_pct": round(bf.mape(result["in_sample"][idx], m[idx]), 3),
                            "loso_mape_pct": round(bf.mape(result["loso"][idx], m[idx]), 3),
                            "unfitted_mape_pct": round(bf.mape(result["unfitted"][idx], m[idx]), 3)}
    return {
        "schema_version": 1,
        "kind": "kvsim-hf-cpu-fit",
        "fit": {"command": command, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "objective": "least squares on log(predicted / measured) over decode steps, terms bounded "
                             "(logistic reparametrisation), Levenberg-Marquardt from the priors",
                "points": len(result["points"]),
                "in_sample_mape_pct": round(bf.mape(result["in_sample"], m), 3),
                "loso_mape_pct": round(bf.mape(result["loso"], m), 3),
                "unfitted_mape_pct": round(bf.mape(result["unfitted"], m), 3),
                "per_shape": per_shape},
        "device": {"file": _rel(result["hw"]), "content_hash": result["device_hash"]},
        "terms": {t.name: {"value": round(result["terms"][t.name], 6), "bounds": [t.lo, t.hi], "prior": t.prior,
                           "meaning": t.meaning} for t in hff.TERMS},
        "loso_folds": {s: {k: round(v, 6) for k, v in f.items()} for s, f in result["folds"].items()},
        "predictions": [{"id": p["id"], "shape": p["shape"], "measured": p["measured"],
                         "in_sample": round(float(a), 6), "loso": round(float(b), 6), "unfitted": round(float(c), 6)}
                        for p, a, b, c in zip(result["points"], result["in_sample"], result["loso"], result["unfitted"])],
    }


def build_parser():
    p = OneLineParser(prog="python -m sim.fit_hf", description="Fit the hf-fit profile's CPU term to plain transformers "
                "decode steps (leave-one-shape-out check).")
    p.add_argument("--measured", nargs="+", default=None, metavar="DIR",
                   help="timing folders or roots (default: traces/data/cpu-hf-sdpa)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"fit file to write (default: {DEFAULT_OUT}; the shipped file only with --update-shipped)")
    p.add_argument("--update-shipped", action="store_true",
                   help=f"write the shipped fit file, {_rel(hff.FIT_FILE)} (tracked), instead of --out")
    return p


# Where a fit goes unless --out says otherwise: results/, so running the tool leaves the checkout clean.
DEFAULT_OUT = Path("results") / "fit-hf" / "hf-cpu-fit.yaml"


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.update_shipped and args.out is not None:
        raise ValueError("--out and --update-shipped: give one")
    args.out = hff.FIT_FILE if args.update_shipped else (args.out or DEFAULT_OUT)
    if args.out != DEFAULT_OUT:      # results/fit-hf/ is made when the fit is written
        output_file("--out", args.out)
    result = run_fit(args.measured)
    command = "python -m sim.fit_hf" + ("" if args.measured is None else " --measured " + " ".join(args.measured))
    if args.update_shipped:
        command += " --update-shipped"
    elif args.out != DEFAULT_OUT:
        command += f" --out {args.out}"
    doc = build_document(result, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, "# hf-fit terms: written by python -m sim.fit_hf (do not edit; re-run fit.command)\n"
                      + yaml.safe_dump(doc, sort_keys=False, width=120))
    fit = doc["fit"]
    terms = ", ".join(f"{k}={v['value']:.4g}" for k, v in doc["terms"].items())
    print(f"{fit['points']} points: unfitted MAPE {fit['unfitted_mape_pct']:.1f}%, in-sample {fit['in_sample_mape_pct']:.1f}%, "
          f"leave-one-shape-out {fit['loso_mape_pct']:.1f}%; {terms}: {args.out}")
    return 0


def main(argv=None) -> int:
    """User mistakes (bad flags, missing folders) are one `error: ...` line and exit code 2 (the kit's run)."""
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
