"""`python -m sim.fit_profiles`: fit the GPU engine profiles' named terms to published measurements, jointly.

    python -m sim.fit_profiles                      # both training CSVs + the kernel file; writes results/
    python -m sim.fit_profiles --update-shipped     # the same, refreshing sim/engine_profiles/gpu-published-fit.yaml

Reads the published rows (sim/validation/published_rows.py: by default both training CSVs of
`../shared/data`, or KVSIM_DATA) and the kernel-level decode-attention rows (sim/validation/published_kernels.py),
keeps the single-device rows of every stack with a profile (TensorRT-LLM and vLLM together: the kernel and GEMM
terms are the same physics on the same chips; each stack's own host terms only see its rows), and fits the
terms of sim/profiles/engines.py (TERMS: each bounded to a physical range, with a prior and a source) by
bounded robust least squares (soft-L1) on log(predicted / measured), from the priors and one mid-range start.
Every row is predicted through the engine as it is now, as it was measured (sim.validation.published_gpu:
static batches, in-flight-batching steady states, capped servers, request rates).

Request-rate rows are predicted through the DES, which is too slow (seconds a run) for the Jacobian's
thousands of evaluations. The descent runs on their closed-form stand-in (Little's law) times a factor per row,
DES / Little's law at the current terms; after each descent the factors are evaluated again at the new terms
and the descent repeated from there, until no factor moves by more than DES_TOL (at most DES_ROUNDS rounds).
At the end each such row's fitted prediction is its DES value at the fitted terms.

Leave-one-family-out (LOFO): for every source family (sim/validation/sources.yaml: TensorRT-LLM static
tables, TensorRT-LLM in-flight tables, vLLM, QServe baselines, blogs) the terms are fitted again without its
rows and its rows predicted with those terms; the file keeps each fold's terms so `python -m sim.validate` can
show out-of-sample error beside in-sample error. The kernel rows stay in every fold (they are another kind of
measurement, not a source of engine rows).

A row's prediction depends only on some terms (row_terms: its stack's host terms, its kernel family's
terms, ...): the Jacobian re-predicts only the rows a term reaches, which is exact because the rule is a
superset of what the engine reads.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import yaml

from sim import bounded_fit as bf
from sim.cli import OneLineParser, atomic_write_text, output_file, run
from sim.models import load_model
from sim.profiles import engines as pe
from sim.validation import published_gpu as pg
from sim.validation import published_kernels as pk

SHIPPED_OUT = pe.SHIPPED_FIT_FILE
DEFAULT_OUT = Path("results") / "fit-profiles" / "gpu-published-fit.yaml"
FIT_ENGINE = "trtllm"          # the profile each row's terms are built on (the row's own stack decides runtime)
TERMS = pe.FITTED_TERMS
MAX_ITER = 20
LOSS_SCALE = 0.05              # soft-L1 knee on the log error: a few rows the physics cannot reach do not drag
PRIOR_WEIGHT = 1e-2            # a faint pull towards the priors: a term no row constrains stays at its prior
KERNEL_WEIGHT = 1.0            # a kernel row weighs as much as an engine row
DES_ROUNDS = 4                 # descents with the request-rate rows' DES factors re-evaluated between them
DES_TOL = 0.005                # ... until none moves by more than this (relative)


def _all_values(z) -> dict[str, float]:
    return {**pe.prior_values(), **bf.values(z, TERMS)}


def _z(values: dict) -> np.ndarray:
    return bf.to_z([values[t.name] for t in TERMS], TERMS)


def row_terms(row) -> frozenset:
    """The terms a row's prediction can depend on (a superset: exactness of the sparse Jacobian)."""
    if row.baseline is not None:
        return row_terms(dataclasses.replace(row, baseline=None)) | row_terms(row.baseline)
    names = {"gemm_eff", "attn_prefill_eff"}
    if row.weight_dtype == "fp8" or row.metric == "speedup_fp8_vs_fp16":
        names.add("fp8_gemm_eff")
    names |= set(pe.RUNTIME_HOST_TERMS[row.runtime])
    if row.batch_kind != "static":
        names.add("runtime_reserve_gb")
    if row.gen > 1 or row.metric in ("tpot_ms",):
        m = load_model(row.model)
        kernels = pe.Kernels(row.engine, row.decode_kernel, row.sliding_window_kernel)
        kv_1byte = row.kv_dtype in ("fp8", "int8", "int4") or row.metric == "speedup_fp8_vs_fp16"
        families = {kernels.family(m, kv_1byte), kernels.family(m, False)}
        names |= {"attn_latency_s", "attn_fp8_kv_eff"}
        names |= {pe.attn.BW_TERM[f] for f in families} | {pe.attn.CORE_TERM[f] for f in families}
        if families & {"per-head", "masked-mha"} and m.n_heads != m.n_kv_heads:
            names.add("attn_l2_reuse")
    return frozenset(n for n in names if n in {t.name for t in TERMS})


class Problem:
    """Engine rows and kernel rows with their measured values; predictions memoised per row on the values of
    the terms it depends on."""

    def __init__(self, rows, kernel_rows, des_factors: dict | None = None):
        self.rows, self.kernel_rows = list(rows), list(kernel_rows)
        self.factors = des_factors or {}      # row index -> DES / Little's law (request-rate rows)
        self.measured = np.array([r.value for r in self.rows] + [k.value for k in self.kernel_rows], float)
        self.deps = [tuple(sorted(row_terms(r))) for r in self.rows]
        self.memo: dict = {}

    def _profile(self, values: dict):
        return pe.make_profile(FIT_ENGINE, values, name=f"{FIT_ENGINE}-fit")

    def predict(self, values: dict, only: int | None = None, base: np.ndarray | None = None) -> np.ndarray:
        """All predictions; with `only` (a term index) and `base`, re-predict just the rows that term reaches."""
        out = np.empty(len(self.measured)) if base is None else base.copy()
        profile = None
        name = TERMS[only].name if only is not None else None
        for i, r in enumerate(self.rows):
            if name is not None and name not in self.deps[i]:
                continue
            key = (i, tuple(values[n] for n in self.deps[i]))
            hit = self.memo.get(key)
            if hit is None:
                profile = profile or self._profile(values)
                hit = self.memo[key] = pg.predict_row(r, profile, des=False)
            out[i] = hit * self.factors.get(i, 1.0)
        n = len(self.rows)
        for j, k in enumerate(self.kernel_rows):
            out[n + j] = pk.predict_kernel(k, values)
        if len(self.memo) > 200_000:
            self.memo.clear()
        return out

    def residuals_from(self, pred: np.ndarray, z) -> np.ndarray:
        r = np.log(pred / self.measured)
        w = np.ones_like(r)
        w[len(self.rows):] = KERNEL_WEIGHT
        rho = 2.0 * (np.sqrt(1.0 + (r / LOSS_SCALE) ** 2) - 1.0) * LOSS_SCALE ** 2
        pull = PRIOR_WEIGHT * (np.asarray(z) - _z(pe.prior_values()))
        return np.concatenate([np.sign(r) * np.sqrt(rho * w), pull])

    def residuals(self, z) -> np.ndarray:
        return self.residuals_from(self.predict(_all_values(z)), z)

    def jacobian(self, z, r0) -> np.ndarray:
        values = _all_values(z)
        base = self.predict(values)
        jac = np.empty((len(r0), len(z)))
        for j in range(len(z)):
            dz = np.array(z, float)
            dz[j] += 1e-4
            pred = self.predict(_all_values(dz), only=j, base=base)
            jac[:, j] = (self.residuals_from(pred, dz) - r0) / 1e-4
        return jac


def start_points() -> list[np.ndarray]:
    """One start: the overheads at their priors, the efficiencies in the middle of their ranges with a slow
    CUDA-core attention rate (the decode-attention rate has two basins, compute-bound rows explained by the
    kernel or by overheads; from the priors, with every rate at its ideal bound, the descent stalls in the
    second: measured 12.4% against 9.2% in-sample). Every fold runs the same start."""
    prior = pe.prior_values()
    mid = dict(prior, gemm_eff=0.8, fp8_gemm_eff=0.8, attn_fp8_kv_eff=0.8, attn_core_eff=0.15, attn_mmha_core_eff=0.15,
               attn_bw_per_head=0.6, attn_bw_cuda_core=0.5, attn_bw_tensor_core=0.8, attn_latency_s=10e-6,
               attn_l2_reuse=0.5)
    return [_z(mid)]


def fit_terms(rows, kernel_rows) -> dict[str, float]:
    """Bounded least squares (Levenberg-Marquardt in a logistic reparametrisation) from each start, the best
    kept; deterministic."""
    if not rows:
        raise ValueError("no rows to fit")
    problem = Problem(rows, kernel_rows)
    best = None
    for z0 in start_points():
        cost, z = bf.descend(problem.residuals, z0, MAX_ITER, jacobian=problem.jacobian)
        if best is None or cost < best[0]:
            best = (cost, z)
    z, factors = best[1], {}
    for _ in range(DES_ROUNDS):
        new = des_factors(rows, _all_values(z))
        if all(abs(f / factors.get(i, 1.0) - 1.0) <= DES_TOL for i, f in new.items()):
            break
        factors = new
        problem = Problem(rows, kernel_rows, factors)
        _, z = bf.descend(problem.residuals, z, MAX_ITER, jacobian=problem.jacobian)
    return _all_values(z)


def des_factors(rows, values: dict) -> dict[int, float]:
    """DES over Little's law for each request-rate row at these terms (row index -> factor)."""
    profile = pe.make_profile(FIT_ENGINE, values, name=f"{FIT_ENGINE}-fit")
    return {i: pg.predict_row(r, profile) / pg.predict_row(r, profile, des=False)
            for i, r in enumerate(rows) if pg.is_rate_row(r)}


def predictions(rows, values: dict, des: bool = True) -> np.ndarray:
    """Each row's prediction at these terms (`des=False`: request-rate rows by Little's law)."""
    profile = pe.make_profile(FIT_ENGINE, values, name=f"{FIT_ENGINE}-fit")
    return np.array([pg.predict_row(r, profile, des) for r in rows])


def _fold(args):
    family, train, held, kernel_rows = args
    values = fit_terms(train, kernel_rows)
    print(f"fit_profiles: {'full fit' if family == 'all' else 'without ' + family} done "
          f"({len(train)} rows)", file=sys.stderr, flush=True)
    return family, values, predictions(held, values)


def run_fit(csvs, kernels: Path, workers: int = 2) -> dict:
    rows = pg.load_rows(csvs)
    fit_rows = [r for r in pg.in_scope(rows) if r.engine in pe.ENGINES]
    if len(fit_rows) < len(TERMS) + 1:
        raise ValueError(f"{len(fit_rows)} single-device rows, need more than {len(TERMS)} (one per term)")
    kernel_rows = pk.load_kernel_rows(kernels) if kernels is not None else []
    families = list(dict.fromkeys(r.family for r in fit_rows))
    jobs = [("all", fit_rows, fit_rows, kernel_rows)]
    jobs += [(f, [r for r in fit_rows if r.family != f], [r for r in fit_rows if r.family == f], kernel_rows)
             for f in families]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        done = {family: (values, pred) for family, values, pred in pool.map(_fold, jobs)}
    terms, in_sample = done["all"]
    loso = np.empty(len(fit_rows))
    for f in families:
        idx = [i for i, r in enumerate(fit_rows) if r.family == f]
        loso[idx] = done[f][1]
    kernel_in = np.array([pk.predict_kernel(k, terms) for k in kernel_rows])
    # request-rate rows are predicted through the DES; their closed-form stand-in beside it (the report shows both)
    profile = pe.make_profile(FIT_ENGINE, terms, name=f"{FIT_ENGINE}-fit")
    little = {i: pg.predict_row(r, profile, des=False) for i, r in enumerate(fit_rows) if pg.is_rate_row(r)}
    return dict(rows=rows, fit_rows=fit_rows, kernel_rows=kernel_rows, measured=np.array([r.value for r in fit_rows]),
                terms=terms, in_sample=in_sample, loso=loso, kernel_in_sample=kernel_in, little=little,
                folds={f: {k: round(v, 9) for k, v in done[f][0].items()} for f in families})


def _term_entries(values: dict, source: str) -> dict:
    return {t.name: {"value": round(values[t.name], 9), "unit": t.unit, "bounds": [t.lo, t.hi], "prior": t.prior,
                     "prior_source": t.prior_source, "meaning": t.meaning,
                     "source": source if t.fitted else f"not fitted: {t.prior_source}"}
            for t in pe.TERMS}


def build_document(result: dict, csvs, kernels: Path, command: str) -> dict:
    fit_rows, rows = result["fit_rows"], result["rows"]
    labels = [pg.display_path(c) for c in csvs]
    fitted_source = (f"fitted by `{command}` to {len(fit_rows)} single-device rows of {', '.join(labels)} and "
                     f"{len(result['kernel_rows'])} kernel rows of {pg.display_path(kernels)}")
    entries = _term_entries(result["terms"], fitted_source)
    engines = {}
    for engine_name in pe.ENGINES:
        own = [r for r in fit_rows if r.engine == engine_name]
        engines[engine_name] = {"fitted": bool(own), "rows": len(own), "terms": entries,
                                "loso_folds": result["folds"]}
    excluded = [{"row": r.index, "csv": r.csv, "id": r.id, "why": r.scope} for r in rows if r not in fit_rows]
    per_row = [{"row": r.index, "csv": r.csv, "id": r.id, "source": r.source, "family": r.family, "regime": r.regime,
                "measured": r.value, "in_sample": round(float(p), 6), "loso": round(float(q), 6),
                **({"little": round(float(result["little"][i]), 6)} if i in result.get("little", {}) else {})}
               for i, (r, p, q) in enumerate(zip(fit_rows, result["in_sample"], result["loso"]))]
    kernel_rows = [{"row": k.index, "id": k.id, "family": k.family, "measured_pct": k.value,
                    "in_sample_pct": round(float(p), 3)} for k, p in zip(result["kernel_rows"], result["kernel_in_sample"])]
    measured, kern = result["measured"], result["kernel_rows"]
    return {
        "schema_version": 2,
        "kind": "kvsim-engine-profiles",
        "fit": {"command": command, "csv": labels, "csv_sha256": [pg.file_sha256(c) for c in csvs],
                "kernels": pg.display_path(kernels), "kernels_sha256": pg.file_sha256(kernels),
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "objective": "soft-L1 loss (5% knee) on log(predicted / measured) over engine and kernel rows, terms "
                             "bounded (logistic reparametrisation), Levenberg-Marquardt from one mid-range "
                             "start",
                "loso": "leave-one-source-family-out (sim/validation/sources.yaml)",
                "rows_fitted": len(fit_rows), "kernel_rows": len(kern), "rows_excluded": excluded,
                "in_sample_mape_pct": round(bf.mape(result["in_sample"], measured), 3),
                "loso_mape_pct": round(bf.mape(result["loso"], measured), 3),
                "kernel_in_sample_mape_pct": round(bf.mape(result["kernel_in_sample"], [k.value for k in kern]), 3)},
        "engines": engines,
        "predictions": per_row,
        "kernel_predictions": kernel_rows,
    }


def write_document(doc: dict, out: Path) -> None:
    header = ("# Engine profiles fitted to published GPU measurements: written by python -m sim.fit_profiles\n"
              "# (do not edit by hand; re-run the command in `fit.command`). Terms: sim/profiles/engines.py.\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, header + yaml.safe_dump(doc, sort_keys=False, width=120))


def build_parser():
    p = OneLineParser(prog="python -m sim.fit_profiles",
                      description="Fit the trtllm/vllm engine profiles' terms to published GPU measurements.")
    p.add_argument("--csv", type=Path, action="append", default=None,
                   help="published measurements (repeatable; default: ../shared/data/gpu-published-train.csv and "
                        "gpu-published-train-2.csv, or the same names under $KVSIM_DATA)")
    p.add_argument("--kernels", type=Path, default=None,
                   help="kernel-level decode-attention rows (default: ../shared/data/gpu-attention-kernels.csv)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"profile file to write (default: {DEFAULT_OUT}; the shipped file only with --update-shipped)")
    p.add_argument("--update-shipped", action="store_true",
                   help=f"write the tracked profile file {pg.display_path(SHIPPED_OUT)}")
    p.add_argument("--workers", type=int, default=2, help="processes for the folds (default 2)")
    p.add_argument("--measured-run", type=Path, nargs="+", default=None, metavar="FILE",
                   help="instead: fit the stack's host terms and GEMM efficiency to your own benchmark runs (vLLM "
                        "bench serve JSON, SGLang bench_serving JSONL, trtllm-bench report), replayed in the DES; "
                        "writes results/fit-profiles/measured-fit.yaml (use it with KVSIM_ENGINE_PROFILES=FILE)")
    p.add_argument("--hw", default=None, help="with --measured-run: the device the runs ran on (name or YAML)")
    p.add_argument("--model", default=None, help="with --measured-run: the model, where the files do not name one")
    p.add_argument("--tp", type=int, default=None, help="with --measured-run: tensor-parallel size, if not 1")
    p.add_argument("--quiet", action="store_true", help="no summary on stdout")
    return p


MEASURED_OUT = Path("results") / "fit-profiles" / "measured-fit.yaml"


def _measured(args) -> int:
    """--measured-run: the user's runs fit their stack's own terms (sim.fit_measured)."""
    from sim import fit_measured
    from sim.validation.measured_run import load_measured_runs
    if args.update_shipped:
        raise ValueError("--measured-run writes a profile of your own runs, never the shipped file: drop --update-shipped")
    if not args.hw:
        raise ValueError("--measured-run needs --hw (the device the runs ran on)")
    out = args.out or MEASURED_OUT
    if out == MEASURED_OUT:
        out.parent.mkdir(parents=True, exist_ok=True)
    output_file("--out", out)
    runs = [run for path in args.measured_run for run in load_measured_runs(path)]
    result = fit_measured.fit_runs(runs, hw=args.hw, model=args.model, tp=args.tp)
    command = "python -m sim.fit_profiles --measured-run " + " ".join(p.name for p in args.measured_run) + \
        f" --hw {args.hw}" + (f" --model {args.model}" if args.model else "")
    doc = fit_measured.document(result, args.measured_run, command)
    write_document(doc, out)
    if not args.quiet:
        fit = doc["fit"]
        terms = ", ".join(f"{n}={result['terms'][n]:.4g}" for n in result["fitted"])
        print(f"{len(doc['items'])} measured metrics of {len(runs)} run(s) ({result['engine']}, {result['runtime']}): "
              f"MAPE {fit['mape_before_pct']:.1f}% with the shipped terms -> {fit['mape_after_pct']:.1f}% with {terms}: "
              f"{pg.display_path(out)}")
    return 0


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.measured_run is not None:
        return _measured(args)
    if args.update_shipped and args.out is not None:
        raise ValueError("--out and --update-shipped: give one")
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    out = SHIPPED_OUT if args.update_shipped else (args.out or DEFAULT_OUT)
    if out == DEFAULT_OUT:
        out.parent.mkdir(parents=True, exist_ok=True)
    output_file("--out", out)
    csvs = args.csv or pg.default_csvs()
    for c in csvs:
        if not Path(c).is_file():
            raise FileNotFoundError(f"--csv {c}: no such file")
    kernels = args.kernels or pk.default_csv()
    if not Path(kernels).is_file():
        raise FileNotFoundError(f"--kernels {kernels}: no such file")
    result = run_fit(csvs, kernels, args.workers)      # checks the row count before the long work
    command = "python -m sim.fit_profiles" + ("" if args.csv is None else "".join(
        f" --csv {pg.display_path(c)}" for c in csvs)) + ("" if args.kernels is None else
                                                         f" --kernels {pg.display_path(kernels)}")
    doc = build_document(result, csvs, kernels, command + (" --update-shipped" if args.update_shipped else ""))
    write_document(doc, out)
    if not args.quiet:
        fit = doc["fit"]
        print(f"{fit['rows_fitted']} rows + {fit['kernel_rows']} kernel rows: in-sample MAPE "
              f"{fit['in_sample_mape_pct']:.1f}%, leave-one-family-out MAPE {fit['loso_mape_pct']:.1f}%, kernel rows "
              f"{fit['kernel_in_sample_mape_pct']:.1f}%: {pg.display_path(out)}")
    return 0


def main(argv=None) -> int:
    """User mistakes (bad flags, a missing CSV, too few rows) are one `error: ...` line and exit code 2."""
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
