"""Fit a stack's own engine terms to a user's measured benchmark runs (`python -m sim.fit_profiles
--measured-run FILE... --hw H [--model M]`): vLLM `bench serve` JSON, SGLang `bench_serving` JSONL, TensorRT-LLM
`trtllm-bench` reports (sim.validation.measured_run reads them; sim.validation.measured_run_replay replays each
run in the DES: its requests, lengths, arrival pattern and concurrency limit).

A handful of runs pins only what they measure: the terms fitted are the stack runtime's host terms (per step,
per running sequence) and the GEMM efficiency; every other term keeps the shipped joint fit's value (the
published rows and the kernel file pin those). Each evaluation is one DES replay per run, so the fit is small:
bounded Levenberg-Marquardt in the terms' logistic coordinates from the shipped values. The result is a profile
file in the shipped file's format (`engines.<engine>.terms`) with the runs' names and hashes as provenance; point
`KVSIM_ENGINE_PROFILES` at it to run `--profile trtllm|vllm` with the user's terms.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
from pathlib import Path

import numpy as np

from sim import bounded_fit as bf
from sim.profiles import engines as pe

# tool -> (engine profile, runtime) the replay runs under: today's releases (vLLM's V1 engine, TensorRT-LLM's
# PyTorch backend); SGLang has no profile of its own and runs under vLLM's kernel terms (its own host terms fitted)
TOOL_ENGINES = {"vllm": ("vllm", "vllm-v1"), "sglang": ("vllm", "vllm-v1"), "trtllm": ("trtllm", "pytorch")}
MAX_ITER = 8


def terms_for(runtime: str) -> tuple:
    """The terms a measured run of `runtime` fits: its host terms (none under TensorRT-LLM's PyTorch backend,
    which hides them behind CUDA graphs and the overlap scheduler) and the GEMM efficiency."""
    names = (() if runtime == "pytorch" else pe.RUNTIME_HOST_TERMS[runtime]) + ("gemm_eff",)
    return tuple(pe.TERMS_BY_NAME[n] for n in names)


def fit_runs(runs, *, hw, model=None, tp=None, base: dict | None = None) -> dict:
    """{engine, runtime, terms (all values), fitted (names), items: [(metric, measured, before, after)]}."""
    from sim.validation.measured_run_replay import fit_items
    if not runs:
        raise ValueError("--measured-run: no runs to fit")
    tools = {r.tool for r in runs}
    if len(tools) > 1:
        raise ValueError(f"--measured-run: runs of one tool at a time, got {', '.join(sorted(tools))}")
    engine_name, runtime = TOOL_ENGINES[tools.pop()]
    values = dict(base or pe.engine_values(pe.read_fit_file(), engine_name, pe.FIT_FILE))
    fitted = terms_for(runtime)
    items = [item for run in runs for item in fit_items(run, hw=hw, model=model, tp=tp)]
    items = [i for i in items if np.isfinite(i.measured) and i.measured > 0]
    if not items:
        raise ValueError("--measured-run: the runs carry no metric kvsim predicts")
    measured = np.array([i.measured for i in items])

    def predict(v: dict) -> np.ndarray:
        profile = pe.make_profile(engine_name, v, name=f"{engine_name}-measured", runtime=runtime)
        return np.array([i.predict(profile) for i in items])

    def with_z(z) -> dict:
        return {**values, **bf.values(z, fitted)}

    def residuals(z):
        return np.log(np.maximum(predict(with_z(z)), 1e-12) / measured)

    before = predict(values)
    z0 = bf.to_z([values[t.name] for t in fitted], fitted)
    _, z = bf.descend(residuals, z0, MAX_ITER)
    terms = with_z(z)
    after = predict(terms)
    return dict(engine=engine_name, runtime=runtime, terms=terms, fitted=[t.name for t in fitted],
                items=[(i.metric, float(m), float(b), float(a)) for i, m, b, a in zip(items, measured, before, after)])


def document(result: dict, paths, command: str) -> dict:
    """The profile file: the shipped format, both engines carrying the terms, provenance of the runs."""
    shipped = pe.read_fit_file()
    source = f"fitted by `{command}` to {len(paths)} measured run file(s)"
    entries = {}
    for t in pe.TERMS:
        fitted = t.name in result["fitted"]
        entries[t.name] = {"value": round(float(result["terms"][t.name]), 9), "unit": t.unit, "bounds": [t.lo, t.hi],
                           "prior": t.prior, "meaning": t.meaning,
                           "source": source if fitted else f"the shipped joint fit ({shipped['fit'].get('date', '?')})"}
    errors = [100.0 * (a / m - 1.0) for _, m, _, a in result["items"]]
    return {
        "schema_version": 2,
        "kind": "kvsim-engine-profiles",
        "fit": {"command": command, "measured_runs": [Path(p).name for p in paths],
                "measured_runs_sha256": [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths],
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "engine": result["engine"], "runtime": result["runtime"], "fitted_terms": result["fitted"],
                "base": f"the shipped joint fit of {shipped['fit'].get('date', '?')}",
                "mape_before_pct": round(float(np.mean([abs(100.0 * (b / m - 1.0)) for _, m, b, _ in result["items"]])), 3),
                "mape_after_pct": round(float(np.mean(np.abs(errors))), 3)},
        "engines": {e: {"fitted": e == result["engine"], "terms": entries} for e in pe.ENGINES},
        "items": [{"metric": k, "measured": m, "before": round(b, 6), "after": round(a, 6)}
                  for k, m, b, a in result["items"]],
    }
