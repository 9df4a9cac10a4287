"""The golden grid: fixed predictions, DES runs and validation points, run through the public CLIs.

Each case is a CLI invocation and the file it writes (or its JSON on stdout), reduced to the columns
that are results (wall times, paths and timestamps removed). `python -m tests.golden.regenerate`
writes tests/golden/data/<case>.txt.gz; tests/golden/test_golden.py requires byte-identical output.
Regenerate only for a change that moves predictions on purpose, in its own commit that says why.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
# Per-run volatile keys (wall clock, paths, environment) dropped from JSON outputs.
VOLATILE = {"wall_s", "sim_wall_s", "elapsed_s", "seconds", "eval_s", "points_per_s", "out", "path", "created",
            "code_version", "timestamp", "load_average", "report", "plot", "points_csv"}

SWEEP = ("--hw h200-sxm,l4,cpu-local --models llama-2-7b,mistral-7b,gpt-j-6b "
         "--policies full,window,streaming,h2o,keyformer --cache-ratios 0.1,0.5,1.0 "
         "--batches 1,16 --beams 1,4 --prompts 4096 --gens 128 --profiles fused,hf,hf-eager,trtllm "
         "--kv-dtypes bf16,fp8 --traces none --no-plots --csv --no-cache")
SWEEP_VARIANTS = ("--hw a100-80g-sxm,mi300x --models mpt-7b,llama-3-8b --policies full,h2o,keyformer "
                  "--cache-ratios 0.2,0.5 --recent-ratios 0.3,0.5 --batches 4 --prompts 512,8192 --gens 64,1024 "
                  "--profiles fused,kvsim-eager,vllm --weight-dtypes bf16,fp32,fp8 --traces none --no-plots --csv "
                  "--no-cache")
PREDICT = [
    "--hw h200-sxm --model llama-2-7b --prompt 4096 --gen 1024 --policy keyformer --cache-ratio 0.1",
    "--hw h200-sxm --model llama-2-7b --prompt 4096 --gen 1024 --policy full",
    "--hw h100-sxm --model llama-3-8b --batch 32 --prompt 2048 --gen 512 --policy h2o --cache-ratio 0.5 --profile trtllm",
    "--hw a100-80g-sxm --model mpt-7b --batch 4 --beams 4 --prompt 1024 --gen 256 --policy keyformer --cache-ratio 0.5 --profile hf-eager",
    "--hw cpu-local --model gpt-j-6b --prompt 512 --gen 64 --policy window --cache-ratio 0.2 --profile hf --weight-dtype fp32 --kv-dtype fp32",
    "--hw mi300x --model mistral-7b --batch 64 --prompt 8192 --gen 512 --policy streaming --cache-ratio 0.3 --kv-dtype fp8",
]
SERVE = [
    "--hw h200-sxm --model llama-2-7b --prompt 4096 --gen 256 --policy keyformer --cache-ratio 0.5 --qps inf --requests 64",
    "--hw h100-sxm --model llama-3-8b --prompt 1024 --gen 128 --policy full --qps 8 --requests 64 --seed 3",
    "--hw a100-80g-sxm --model mistral-7b --prompt 2048 --gen 256 --policy h2o --cache-ratio 0.2 --qps 20 --requests 48 "
    "--arrivals gamma --cv 2 --chunked-prefill 1024 --admission reserve",
]
MEASURED = "traces/data/cpu traces/data/cpu-hf"


@dataclass(frozen=True)
class Case:
    name: str
    module: str
    argv: str
    output: str | None = None      # file in the --out folder; None: JSON on stdout
    out_flag: bool = True
    needs: str | None = None       # a path the case needs (skipped when absent)


def cases() -> list[Case]:
    out = [Case("sweep-analytic", "sim.sweep", SWEEP, "points.csv"),
           Case("sweep-variants", "sim.sweep", SWEEP_VARIANTS, "points.csv"),
           Case("sweep-des", "sim.sweep",
                "--hw h200-sxm,l40s --models llama-3-8b,gpt-j-6b --policies full,h2o,keyformer --cache-ratios 0.2,1.0 "
                "--batches 8 --prompts 1024 --gens 64 --engine des --qps inf --requests 24 --traces none --no-plots "
                "--csv --no-cache", "points.csv")]
    out += [Case(f"predict-{i}", "sim.predict", a + " --json --breakdown", out_flag=False) for i, a in enumerate(PREDICT)]
    out += [Case(f"serve-{i}", "sim.serve", a + " --json --no-progress", out_flag=False) for i, a in enumerate(SERVE)]
    out.append(Case("validate-measured", "sim.validate", f"--measured {MEASURED} --no-published-gpu --quiet",
                    "validation-points.csv"))
    out.append(Case("validate-published-gpu", "sim.validate", "--no-measured --quiet --json",
                    None, out_flag=True, needs="../shared/data/gpu-published-train.csv"))
    return out


def _clean(value):
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def golden_path(case: Case) -> Path:
    return DATA / f"{case.name}.txt.gz"


def read_golden(case: Case) -> str:
    return gzip.decompress(golden_path(case).read_bytes()).decode()


def write_golden(case: Case, text: str) -> None:
    golden_path(case).write_bytes(gzip.compress(text.encode(), mtime=0))


def run_case(case: Case, tmp: Path) -> str:
    """The case's result as text: a CSV (float repr, round-trip exact) or sorted JSON."""
    import importlib
    module = importlib.import_module(case.module)
    argv = case.argv.split() + (["--out", str(tmp)] if case.out_flag else [])
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        rc = module.main(argv)
    if rc not in (0, None):
        raise RuntimeError(f"{case.module} {case.argv} exited {rc}")
    if case.output is not None:
        frame = pd.read_csv(tmp / case.output, float_precision="round_trip")
        frame = frame.drop(columns=[c for c in frame.columns if c in VOLATILE])
        return frame.to_csv(index=False)
    text = stdout.getvalue()
    start = text.index("{")
    return json.dumps(_clean(json.loads(text[start:])), indent=1, sort_keys=True) + "\n"
