"""The `hf-fit` section of `python -m sim.validate`: plain transformers decode steps on CPU under the `hf`
profile with its fitted CPU term (sim/profiles/hf_fit.py), in-sample beside leave-one-shape-out.

Every point of the fit's folders is predicted on the engine as it is now three ways: unfitted `hf`, with
the file's terms (in-sample: fitted to these points) and with the terms fitted without the point's model
shape (LOSO: the fold never saw that model). The target is stated on LOSO. When today's in-sample
predictions differ from the file's, the section says the terms are stale (re-run `python -m sim.fit_hf`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from sim import bounded_fit as bf
from sim import fit_hf
from sim.profiles import hf_fit as hff

LOSO_TARGET = 10.0
STALE_PCT = 0.5


def build_section(fit_file: Path | str = hff.FIT_FILE) -> tuple[list[str], dict]:
    head = ["## Plain transformers on CPU with a fitted term (`hf-fit`)", ""]
    if not Path(fit_file).is_file():
        return head + [f"Skipped: no fit file {fit_file} (run `python -m sim.fit_hf`).", ""], {"skipped": "no fit file"}
    data = hff.read_fit_file(fit_file)
    fit = data["fit"]
    points, hw, device_hash = fit_hf.load_points()
    if device_hash != data["device"]["content_hash"]:
        return head + [f"Skipped: the folders are predicted on {fit_hf._rel(hw)} (content hash {device_hash}), the fit "
                       f"was made for {data['device']['file']} ({data['device']['content_hash']}): re-run "
                       "`python -m sim.fit_hf`.", ""], {"skipped": "other hardware file"}
    measured = np.array([p["measured"] for p in points])
    terms = hff.check_values(data["terms"], str(fit_file))
    in_sample = fit_hf.predictions(points, terms, hw, device_hash)
    unfitted = fit_hf.predictions(points, {t.name: t.prior for t in hff.TERMS}, hw, device_hash)
    loso = np.empty(len(points))
    for shape, values in data["loso_folds"].items():
        idx = [i for i, p in enumerate(points) if p["shape"] == shape]
        if idx:
            loso[idx] = fit_hf.predictions([points[i] for i in idx], hff.check_values(values, f"fold {shape}"), hw,
                                           device_hash)
    stored = {p["id"]: p["in_sample"] for p in data.get("predictions", [])}
    moved = max((abs(v / stored[p["id"]] - 1) * 100 for p, v in zip(points, in_sample) if p["id"] in stored),
                default=0.0)
    lines = head + [
        f"{len(points)} decode steps of transformers' own greedy `generate` (SDPA, DynamicCache) in "
        f"{', '.join(sorted({p['id'].rsplit('/', 2)[0] for p in points}))}, predicted on {data['device']['file']}. "
        f"Terms fitted {fit.get('date', '?')} by `{fit.get('command', '?')}`; LOSO: each model shape predicted with "
        f"the terms fitted to the other shapes only. Target: LOSO MAPE <= {LOSO_TARGET:g}%.", ""]
    if moved > STALE_PCT:
        lines += [f"WARNING: in-sample predictions moved by up to {moved:.1f}% since the fit: the terms are stale, "
                  "re-run `python -m sim.fit_hf`.", ""]
    lines += ["| shape | points | unfitted hf MAPE % | in-sample MAPE % | LOSO MAPE % | LOSO max % |", "|---|---|---|---|---|---|"]
    summary = {}
    for shape in list(dict.fromkeys(p["shape"] for p in points)) + ["overall"]:
        idx = [i for i, p in enumerate(points) if shape in ("overall", p["shape"])]
        m = measured[idx]
        row = dict(points=len(idx), unfitted=bf.mape(unfitted[idx], m), in_sample=bf.mape(in_sample[idx], m),
                   loso=bf.mape(loso[idx], m), loso_max=float(np.max(np.abs(loso[idx] - m) / m) * 100))
        summary[shape] = {k: round(v, 3) for k, v in row.items()}
        lines.append(f"| {shape} | {row['points']} | {row['unfitted']:.1f} | {row['in_sample']:.1f} | {row['loso']:.1f} | "
                     f"{row['loso_max']:.1f} |")
    status = "PASS" if summary["overall"]["loso"] <= LOSO_TARGET else "FAIL"
    summary["status"] = status
    lines += ["", f"Leave-one-shape-out MAPE {summary['overall']['loso']:.1f}% (target <= {LOSO_TARGET:g}%): **{status}**.", "",
              "| term | value | bounds | per fold (left-out shape: value) | meaning |", "|---|---|---|---|---|"]
    for t in hff.TERMS:
        folds = ", ".join(f"{s}: {v[t.name]:.3g}" for s, v in data["loso_folds"].items())
        lines.append(f"| {t.name} | {terms[t.name]:.4g} | [{t.lo:g}, {t.hi:g}] | {folds} | {t.meaning} |")
    return lines + [""], summary
