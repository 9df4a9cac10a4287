"""`python -m sim.fit_energy`: fit sim.energy's power terms to measured GPU power and check them
leave-one-batch-out; transfer them to the devices nobody measured.

    python -m sim.fit_energy                         # writes results/fit-energy/energy-fit.yaml
    python -m sim.fit_energy --update-shipped        # also rewrites the energy sections of hwmodels/platform/*.yaml

Model, per device: P = static_power + e_byte x bytes/s + e_flop x FLOP/s, capped at the TDP, with the rows'
bytes and FLOPs from the operator tables and their measured rates (sim.energy_rows). Per measured device
(H100 SXM and B200 in ../shared/data/gpu-energy-train.csv) the three terms are fitted by bounded least
squares on log(modelled / measured power), bounds below; leave-one-batch-out (LOBO) refits without every
row of one batch cap and predicts those. Energy per output token is power x devices / tokens per second
at the measured rate, so its relative errors are those of the power.

Transfer to the other shipped devices (documented physics, `transfer`):
- the same GPU die as a fitted device (H200 SXM, both GH200s: the H100's GH100): its three terms;
- other dies: static power at the reference's share of the TDP; FLOP energy at the reference's share of
  the TDP at the dense bf16 peak (e_flop = share x TDP / peak); byte energy of HBM parts the reference's,
  of GDDR6 parts the reference's x GDDR6_OVER_HBM.
"""
from __future__ import annotations

import datetime as _dt
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from sim import bounded_fit as bf
from sim import energy_rows as er
from sim.cli import OneLineParser, UserError, atomic_write_text, output_file, run

DEFAULT_OUT = Path("results/fit-energy/energy-fit.yaml")
SHIPPED_RECORD = Path(__file__).resolve().parents[1] / "hwmodels" / "platform" / "fit" / "energy-fit.yaml"
MAX_ITER = 200
REFERENCE = "h100-sxm"               # the transfer's reference: the device with three models in the CSV
SAME_DIE = {"h200-sxm": "h100-sxm", "gh200": "h100-sxm", "gh200-144g": "h100-sxm"}
GDDR6_OVER_HBM = 7.5 / 3.9           # from memory: GDDR6 ~7.5 pJ/bit (Micron, Rambus) vs HBM2 ~3.9 (O'Connor et al., MICRO 2017)
ASSUMED_TDP = {"tpu-v5e": 200.0}     # no published board power: an assumption, written as such


@dataclass(frozen=True)
class Term:
    name: str
    lo: float
    hi: float
    prior: float
    unit: str
    meaning: str


def terms_for(tdp_w: float) -> list[Term]:
    """The three terms and their physical bounds (static power as a share of this board's TDP)."""
    return [Term("static_power", 0.1 * tdp_w, 0.8 * tdp_w, 0.4 * tdp_w, "W",
                 "drawn while serving whatever the step does (clocks, leakage, refresh, work between kernels); "
                 "bounds 10-80% of the TDP"),
            Term("dram_energy", 3e-12, 16e-12, 6e-12, "J/bit",
                 "per bit of device-memory traffic with its trip through L2 to the cores; bounds 3-16 pJ/bit "
                 "(HBM access about 3.9 pJ/bit from memory of O'Connor et al., MICRO 2017, plus on-chip movement)"),
            Term("flop_energy_bf16", 0.1e-12, 3e-12, 0.7e-12, "J/FLOP",
                 "per bf16 FLOP of the model's operators as the stack runs them (tensor cores, operand delivery, "
                 "and the work the tables do not count); bounds 0.1-3 pJ/FLOP")]


def modelled_power(values: dict, rates: np.ndarray, tdp_w: float) -> np.ndarray:
    """Per-device power of rows with (bytes/s, FLOP/s) `rates`, capped at the TDP."""
    lin = values["static_power"] + values["dram_energy"] * 8 * rates[:, 0] + values["flop_energy_bf16"] * rates[:, 1]
    return np.minimum(lin, tdp_w)


def fit_terms(rates: np.ndarray, measured: np.ndarray, tdp_w: float) -> dict:
    terms = terms_for(tdp_w)

    def residuals(z):
        return np.log(modelled_power(bf.values(z, terms), rates, tdp_w) / measured)

    _, z = bf.descend(residuals, bf.to_z([t.prior for t in terms], terms), MAX_ITER)
    return bf.values(z, terms)


def _tdp(name: str) -> float:
    from hwmodels.platform import load_energy
    energy = load_energy(name)
    return (energy.tdp_w if energy is not None else None) or ASSUMED_TDP[name]


def run_fit(csv=None, prompt: int = er.DEFAULT_PROMPT) -> dict:
    rows = er.load_rows(csv)
    rates = np.array([er.work_rates(r, prompt) for r in rows])
    measured = np.array([r.power_w for r in rows])
    devices = {}
    for hw in dict.fromkeys(r.hw for r in rows):
        idx = np.array([i for i, r in enumerate(rows) if r.hw == hw])
        tdp = _tdp(hw)
        terms = fit_terms(rates[idx], measured[idx], tdp)
        lobo, folds = np.empty(len(idx)), {}
        caps = np.array([rows[i].batch_cap for i in idx])
        for cap in sorted(set(caps)):
            out = caps == cap
            folds[int(cap)] = fit_terms(rates[idx][~out], measured[idx][~out], tdp)
            lobo[out] = modelled_power(folds[int(cap)], rates[idx][out], tdp)
        devices[hw] = dict(idx=idx, tdp=tdp, terms=terms, in_sample=modelled_power(terms, rates[idx], tdp),
                           lobo=lobo, folds=folds)
    return dict(rows=rows, rates=rates, measured=measured, devices=devices, prompt=prompt,
                csv=Path(csv) if csv is not None else er.default_csv())


def _errors(pred, measured) -> dict:
    e = np.asarray(pred) / np.asarray(measured) - 1
    return {"mape_pct": round(float(np.mean(np.abs(e)) * 100), 2), "max_abs_pct": round(float(np.max(np.abs(e)) * 100), 2)}


def transfer(name: str, fitted: dict) -> dict:
    """Terms of a shipped device from the fitted ones: {term: (value, source)} (module doc's rules)."""
    from hwmodels import load_device
    from hwmodels.platform import load_energy
    if name in fitted:
        return {k: (v, "fitted") for k, v in fitted[name]["terms"].items()}
    if name in SAME_DIE and SAME_DIE[name] in fitted:
        ref = SAME_DIE[name]
        return {k: (v, f"transferred: the {ref} fit (the same GPU die and clocks)") for k, v in fitted[ref]["terms"].items()}
    ref, t = REFERENCE, fitted[REFERENCE]
    ref_dev, dev = load_device(ref), load_device(name)
    ref_tdp, tdp = fitted[ref]["tdp"], _tdp(name)
    static_share = t["terms"]["static_power"] / ref_tdp
    flop_share = t["terms"]["flop_energy_bf16"] * ref_dev.peak_flops("bf16") / ref_tdp
    gddr = "GDDR" in (load_energy(name).memory_kind or "").upper()
    return {"static_power": (static_share * tdp, f"transferred: the {ref} fit's {static_share:.1%} of the TDP x "
                                                 f"this TDP {tdp:g} W"),
            "flop_energy_bf16": (flop_share * tdp / dev.peak_flops("bf16"),
                                 f"transferred: the {ref} fit draws {flop_share:.1%} of its TDP per FLOP/s at the dense "
                                 f"bf16 peak; the same share of this TDP {tdp:g} W at this peak "
                                 f"{dev.peak_flops('bf16') / 1e12:g} TFLOP/s"),
            "dram_energy": (t["terms"]["dram_energy"] * (GDDR6_OVER_HBM if gddr else 1.0),
                            f"transferred: the {ref} fit" + (f" x {GDDR6_OVER_HBM:.2f}, GDDR6 over HBM (from memory: GDDR6 "
                                                             "about 7.5 pJ/bit, HBM2 about 3.9)" if gddr else
                                                             " (HBM, the same per-bit figure)"))}


def build_document(result: dict, command: str) -> dict:
    from sim.validation.published_gpu import display_path, file_sha256
    rows, m = result["rows"], result["measured"]
    devices = {}
    for hw, d in result["devices"].items():
        idx = d["idx"]
        devices[hw] = {"rows": len(idx), "tdp_w": d["tdp"],
                       "terms": {t.name: {"value": float(f"{d['terms'][t.name]:.4g}"), "unit": t.unit,
                                          "bounds": [t.lo, t.hi], "meaning": t.meaning} for t in terms_for(d["tdp"])},
                       "in_sample": _errors(d["in_sample"], m[idx]), "leave_one_batch_out": _errors(d["lobo"], m[idx]),
                       "lobo_folds": {cap: {k: float(f"{v:.4g}") for k, v in f.items()} for cap, f in d["folds"].items()}}
    predictions = []
    for hw, d in result["devices"].items():
        for j, i in enumerate(d["idx"]):
            r = rows[i]
            predictions.append({"id": r.id, "measured_w": round(r.power_w, 2), "in_sample_w": round(float(d["in_sample"][j]), 2),
                                "lobo_w": round(float(d["lobo"][j]), 2), "measured_j_per_token": r.j_per_token,
                                "lobo_j_per_token": round(float(d["lobo"][j]) * r.devices / r.tokens_per_s, 5),
                                "bytes_per_s": float(f"{result['rates'][i, 0]:.4g}"),
                                "flops_per_s": float(f"{result['rates'][i, 1]:.4g}")})
    lobo_all = np.concatenate([d["lobo"] for d in result["devices"].values()])
    m_all = np.concatenate([m[d["idx"]] for d in result["devices"].values()])
    return {"schema_version": 1, "kind": "kvsim-energy-fit",
            "fit": {"command": command, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
                    "csv": display_path(result["csv"]), "csv_sha256": file_sha256(result["csv"])[:16],
                    "prompt_tokens_assumed": result["prompt"], "rows": len(rows),
                    "objective": "least squares on log(modelled / measured mean power per device), terms bounded "
                                 "(logistic reparametrisation), Levenberg-Marquardt from the priors; power capped at the TDP",
                    "leave_one_batch_out": _errors(lobo_all, m_all),
                    "note": "J per output token = power x devices / measured tokens per second: the same relative errors"},
            "devices": devices, "predictions": predictions}


def energy_block(name: str, fitted: dict, doc: dict, old_block: str) -> str:
    """The `energy:` section of a platform file with fitted or transferred terms (memory_kind, tdp kept)."""
    values = transfer(name, fitted)
    keep = {k: line for line in old_block.splitlines() for k in ("memory_kind", "tdp") if line.strip().startswith(k + ":")}
    fit = doc["fit"]
    stamp = (f"python -m sim.fit_energy on {fit['csv']} (sha256 {fit['csv_sha256']}, {fit['date']}, prompt "
             f"{fit['prompt_tokens_assumed']} tokens assumed)")
    quality = ""
    if name in doc["devices"]:
        d = doc["devices"][name]
        quality = (f"; {d['rows']} rows, power in-sample MAPE {d['in_sample']['mape_pct']}%, leave-one-batch-out "
                   f"MAPE {d['leave_one_batch_out']['mape_pct']}% (max {d['leave_one_batch_out']['max_abs_pct']}%)")

    def src(term):
        how = values[term][1]
        return f"{how}: {stamp}{quality if how == 'fitted' else ''}".replace('"', "'")

    lines = ["energy:", keep.get("memory_kind", "  memory_kind: \"\""),
             f"  dram_energy: {{value: {values['dram_energy'][0] * 1e12:.3g}, unit: pJ/bit, source: \"{src('dram_energy')}\"}}",
             "  flop_energy:        # per dtype; a dtype not listed: the same power at its own dense peak",
             f"    bf16: {{value: {values['flop_energy_bf16'][0] * 1e12:.3g}, unit: pJ/FLOP, source: \"{src('flop_energy_bf16')}\"}}",
             f"  static_power: {{value: {values['static_power'][0]:.3g}, unit: W, source: \"{src('static_power')}\"}}"]
    if "tdp" in keep:
        lines.append(keep["tdp"])
    elif name in ASSUMED_TDP:
        lines.append(f"  tdp: {{value: {ASSUMED_TDP[name]:g}, unit: W, source: \"assumption: no published board power; "
                     "a rough guess of the chip's power budget, used as the cap and for the transferred terms\"}")
    return "\n".join(lines) + "\n"


def update_shipped(result: dict, doc: dict) -> list[Path]:
    """Rewrite the energy section of every shipped platform file in place (the rest of each file untouched)."""
    from hwmodels.platform import PLATFORM_DIR
    written = []
    for path in sorted(PLATFORM_DIR.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        match = re.search(r"^energy:\n(?:[ #].*\n|\n)*", text, flags=re.M)
        if match is None:
            continue
        new = text[:match.start()] + energy_block(path.stem, result["devices"], doc, match.group(0)) + text[match.end():]
        atomic_write_text(path, new)
        written.append(path)
    SHIPPED_RECORD.parent.mkdir(exist_ok=True)
    atomic_write_text(SHIPPED_RECORD, yaml.safe_dump(doc, sort_keys=False, width=120))
    return written + [SHIPPED_RECORD]


def build_parser():
    p = OneLineParser(prog="python -m sim.fit_energy",
                      description="Fit the power model's terms (static power, energy per byte and per FLOP) to measured "
                                  "GPU power; leave-one-batch-out check; transfer to the other devices.")
    p.add_argument("--csv", type=Path, default=None,
                   help="energy measurements (default: ../shared/data/gpu-energy-train.csv, or $KVSIM_DATA/...)")
    p.add_argument("--prompt-tokens", type=int, default=er.DEFAULT_PROMPT,
                   help="mean prompt length the rows are taken to have (not published; an assumption)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"fit document to write (default: {DEFAULT_OUT})")
    p.add_argument("--update-shipped", action="store_true",
                   help="also rewrite the energy sections of hwmodels/platform/*.yaml and hwmodels/platform/fit/")
    return p


def _main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.prompt_tokens < 1:
        raise UserError(f"--prompt-tokens must be >= 1, got {a.prompt_tokens}")
    if a.out.parent == Path("results/fit-energy") and not a.out.parent.exists():
        a.out.parent.mkdir(parents=True)
    output_file("--out", a.out)
    result = run_fit(a.csv, a.prompt_tokens)
    command = "python -m sim.fit_energy" + ("" if a.prompt_tokens == er.DEFAULT_PROMPT else f" --prompt-tokens {a.prompt_tokens}")
    doc = build_document(result, command)
    atomic_write_text(a.out, yaml.safe_dump(doc, sort_keys=False, width=120))
    for hw, d in doc["devices"].items():
        t = d["terms"]
        print(f"{hw}: static {t['static_power']['value']:g} W, {t['dram_energy']['value'] * 1e12:.3g} pJ/bit, "
              f"{t['flop_energy_bf16']['value'] * 1e12:.3g} pJ/FLOP; power in-sample MAPE {d['in_sample']['mape_pct']}% "
              f"(max {d['in_sample']['max_abs_pct']}%), leave-one-batch-out {d['leave_one_batch_out']['mape_pct']}% "
              f"(max {d['leave_one_batch_out']['max_abs_pct']}%) over {d['rows']} rows")
    print(f"wrote {a.out}")
    if a.update_shipped:
        for path in update_shipped(result, doc):
            print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
