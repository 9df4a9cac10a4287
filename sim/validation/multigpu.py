"""The multi-GPU rows of the published measurements (tp > 1) against sim.parallel's predictions.

`sim.validation.published_gpu` reads the CSV (hardware and model names resolved there) and leaves rows with
tp > 1 out of the single-device scope; this module predicts them with tensor parallelism: in the training CSV,
NVIDIA NIM's Llama-3.3-70B on 2x H100 SXM (TTFT and the inter-token latency of its notes) and AMD's
Llama-3.1-70B on 8x MI300X (whole-batch end-to-end latency). A row in-flight batched at maximum load
("dynamic") runs at the TP group's steady-state batch (published_gpu.steady_state_batch). Each row is
predicted under its stack's engine profile (published_gpu: vLLM rows -> vllm, TensorRT-LLM and NIM ->
trtllm, TensorRT-LLM 1.0's PyTorch backend under its runtime) and under `fused` (ideal kernels) for reference.
The published-GPU section of `python -m sim.validate` shows the same rows, held out (never fitted).

    python -m sim.validation.multigpu [--csv PATH] [--json]
"""
from __future__ import annotations

import json
import re
import sys

from sim import parallel
from sim.cli import OneLineParser, run
from sim.models import load_model

from . import published_gpu as pg


def itl_ms(notes: str) -> float | None:
    """The inter-token latency a row's notes give ("ITL 18.58 ms"), or None."""
    found = re.search(r"ITL\s+([0-9.]+)\s*ms", notes or "")
    return float(found.group(1)) if found else None


def rows(csv=None) -> list[dict]:
    """The tp > 1 rows as (label, device, model, tp, point, metric, measured) records; the ITL in a row's notes
    becomes a metric of its own (tpot_ms)."""
    out = []
    for r in pg.load_rows(csv):
        if r.tp <= 1 or not r.predictable:
            continue            # one device, or kvsim lacks something (Row.scope says what)
        notes = r.notes
        # in-flight batching at maximum load ("dynamic"): the steady-state batch of the TP group's KV pool,
        # predicted as that fixed batch (its prefill and decode steps; published_gpu's steady state)
        batch = r.batch if r.batch is not None else int(pg.steady_state_batch(r))
        label = f"b{r.batch}" if r.batch is not None else f"dyn(b{batch})"
        base = dict(id=f"{r.source}/{r.hw}x{r.tp}/{r.model}/{label}/{r.prompt}+{r.gen}", source=r.source,
                    hw=r.hw, model=r.model, model_label=r.model_label, tp=r.tp, batch=batch, prompt=r.prompt,
                    gen=r.gen, weight_dtype=r.weight_dtype, kv_dtype=r.kv_dtype, engine=r.engine, runtime=r.runtime,
                    fixed_batch=r.batch is not None)
        out.append(dict(base, metric=r.metric, measured=r.value))
        if itl_ms(notes) is not None and r.metric != "tpot_ms":
            out.append(dict(base, metric="tpot_ms", measured=itl_ms(notes)))
    return out


def predict_value(row: dict, profile: str) -> float:
    """The row's metric under `profile`. A fixed batch larger than the TP group holds at its peak (the KV of
    prompt + gen per request on every rank) runs in waves of the largest batch that fits (sim.parallel.waves):
    its end-to-end time and throughput are the waves'; TTFT and time per token stay those of the batch."""
    profile = pg.runtime_profile(row.get("runtime", "classic"), profile)
    p = parallel.predict(row["hw"], load_model(row["model"]), row["batch"], row["prompt"], row["gen"], "full", 1.0,
                         kv_dtype=row["kv_dtype"], weight_dtype=row["weight_dtype"], profile=profile, tp=row["tp"])
    if p.extra["waves"] == 0:
        raise ValueError(f"not one request of {row['prompt']} + {row['gen']} tokens fits on a device of tp={row['tp']}")
    fixed = row.get("fixed_batch", True)        # in-flight rows run at the steady-state batch, which fits
    return {"ttft_ms": p.ttft_s * 1e3, "tpot_ms": p.tpot_s * 1e3,
            "e2e_latency_s": p.extra["e2e_in_waves_s"] if fixed else p.e2e_s,
            "out_tok_per_s": p.extra["tokens_per_s_in_waves"] if fixed else p.tokens_per_s}[row["metric"]]


def report(csv=None) -> list[dict]:
    out = []
    for row in rows(csv):
        rec = dict(row)
        try:
            for label, profile in (("stack", row["engine"]), ("fused", "fused")):
                value = predict_value(row, profile)
                rec[f"predicted_{label}"] = value
                rec[f"error_pct_{label}"] = pg.error_pct(value, row["measured"])
        except ValueError as exc:                       # a point sim.parallel refuses (e.g. does not fit)
            rec.update(predicted_stack=float("nan"), error_pct_stack=float("nan"), predicted_fused=float("nan"),
                       error_pct_fused=float("nan"), error=str(exc))
        out.append(rec)
    return out


def _main(argv=None) -> int:
    p = OneLineParser(prog="python -m sim.validation.multigpu", description=__doc__.split("\n")[0])
    p.add_argument("--csv", help="published measurements CSV (default ../shared/data/gpu-published-train.csv)")
    p.add_argument("--json", action="store_true", help="print JSON records")
    a = p.parse_args(argv)
    recs = report(a.csv)          # a missing or malformed CSV: one error line from run()
    if a.json:
        print(json.dumps(recs, indent=1))
        return 0
    for r in recs:
        if "error" in r:
            print(f"{r['source']:9s} {r['hw']:9s} tp={r['tp']} {r['metric']:14s} not predicted: {r['error']}")
            continue
        print(f"{r['source']:9s} {r['hw']:9s} tp={r['tp']} {r['metric']:14s} measured {r['measured']:10.4g}  "
              f"{r['engine']} {r['predicted_stack']:10.4g} ({r['error_pct_stack']:+.1f}%)  "
              f"fused {r['predicted_fused']:10.4g} ({r['error_pct_fused']:+.1f}%)")
    return 0


def main(argv=None) -> int:
    """User mistakes (bad flags, a missing CSV) are one `error: ...` line and exit code 2 (the kit's run)."""
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
