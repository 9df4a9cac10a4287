"""The multi-GPU rows of the published measurements (tp > 1) against sim.parallel's predictions.

`sim.validation.published_gpu` reads the CSV and leaves rows with tp > 1 out of the single-device scope;
this module predicts them with tensor parallelism: NVIDIA NIM's Llama-3.3-70B on 2x H100 SXM (TTFT and the
inter-token latency of its notes) and AMD's Llama-3.1-70B on 8x MI300X (whole-batch end-to-end latency).
Each row is predicted under its stack's engine profile (published_gpu: vLLM rows -> vllm, NIM -> trtllm)
and under `fused` (ideal kernels) for reference.

    python -m sim.validation.multigpu [--csv PATH] [--json]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace

from sim import parallel
from sim.models import load_model

from . import published_gpu as pg

# Llama-3.x-70B (3, 3.1 and 3.3 share the shapes: 80 layers, d_model 8192, 64 heads, 8 KV heads, d_ff 28672,
# as Llama-2-70B) with the 128,256-token vocabulary and the 3.1 context of 131,072 positions (from memory of
# the meta-llama/Llama-3.1-70B config.json: vocab_size 128256, max_position_embeddings 131072).
LLAMA3_70B_NAMES = ("meta/llama-3.3-70b-instruct", "amd/Llama-3.1-70B-Instruct-FP8-KV", "meta-llama/Llama-3.1-70B",
                    "meta-llama/Meta-Llama-3-70B")


def llama3_70b():
    return replace(load_model("llama-2-70b"), name="llama-3-70b", vocab_size=128256, max_positions=131072,
                   source="llama-2-70b shapes with Llama 3's vocabulary and context (sim.validation.multigpu)")


def model_for(label: str):
    if any(label.startswith(name) for name in LLAMA3_70B_NAMES):
        return llama3_70b()
    name = pg.MODELS.get(label)
    return load_model(name) if name else None


def hw_for(label: str) -> str | None:
    return next((name for prefix, name in pg.HW_PREFIXES if label.strip().upper().startswith(prefix)), None)


def itl_ms(notes: str) -> float | None:
    """The inter-token latency a row's notes give ("ITL 18.58 ms"), or None."""
    found = re.search(r"ITL\s+([0-9.]+)\s*ms", notes or "")
    return float(found.group(1)) if found else None


def rows(csv=None) -> list[dict]:
    """The tp > 1 rows as (label, device, model, tp, point, metric, measured) records; the ITL in a row's notes
    becomes a metric of its own (tpot_ms)."""
    import pandas as pd
    path = csv or pg.default_csv()
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    out = []
    for r in pg.load_rows(path):
        if r.tp <= 1:
            continue
        notes = table.iloc[r.index - 1]["notes"]
        base = dict(id=f"{r.source}/{r.hw_label}/{r.model_label}/b{r.batch}/{r.prompt}+{r.gen}", source=r.source, hw=hw_for(r.hw_label), model_label=r.model_label,
                    tp=r.tp, batch=r.batch or 1, prompt=r.prompt, gen=r.gen, weight_dtype=r.weight_dtype,
                    kv_dtype=r.kv_dtype, engine=r.engine)
        out.append(dict(base, metric=r.metric, measured=r.value))
        if itl_ms(notes) is not None:
            out.append(dict(base, metric="tpot_ms", measured=itl_ms(notes)))
    return out


def predict_value(row: dict, profile: str) -> float:
    model = model_for(row["model_label"])
    if row["hw"] is None or model is None:
        raise ValueError(f"{row['id']}: no hardware file or model spec")
    p = parallel.predict(row["hw"], model, row["batch"], row["prompt"], row["gen"], "full", 1.0,
                         kv_dtype=row["kv_dtype"], weight_dtype=row["weight_dtype"], profile=profile, tp=row["tp"])
    return {"ttft_ms": p.ttft_s * 1e3, "tpot_ms": p.tpot_s * 1e3, "e2e_latency_s": p.e2e_s,
            "out_tok_per_s": p.tokens_per_s}[row["metric"]]


def report(csv=None) -> list[dict]:
    out = []
    for row in rows(csv):
        rec = dict(row)
        for label, profile in (("stack", row["engine"]), ("fused", "fused")):
            value = predict_value(row, profile)
            rec[f"predicted_{label}"] = value
            rec[f"error_pct_{label}"] = pg.error_pct(value, row["measured"])
        out.append(rec)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.validation.multigpu", description=__doc__.split("\n")[0])
    p.add_argument("--csv", help="published measurements CSV (default ../shared/data/gpu-published-train.csv)")
    p.add_argument("--json", action="store_true", help="print JSON records")
    a = p.parse_args(argv)
    try:
        recs = report(a.csv)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(recs, indent=1))
        return 0
    for r in recs:
        print(f"{r['source']:9s} {r['hw']:9s} tp={r['tp']} {r['metric']:14s} measured {r['measured']:10.4g}  "
              f"{r['engine']} {r['predicted_stack']:10.4g} ({r['error_pct_stack']:+.1f}%)  "
              f"fused {r['predicted_fused']:10.4g} ({r['error_pct_fused']:+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
