"""python -m traces.capture: run a model under KV policies over a dataset and write a trace folder."""
from __future__ import annotations

import argparse
import os
import sys

# OpenMP reads this when torch starts: set it before anything imports torch (docs/ARCHITECTURE.md).
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

from hwmodels.cli import OneLineParser
from traces.capture import DEFAULT_RATIOS, CaptureConfig
from traces.datasets import DATASETS


def _ratios(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m traces.capture",
                description="Capture KV traces (kept tokens, retained attention mass, step times, texts).")
    p.add_argument("--model", required=True,
                   help="model folder, HF id, or smollm2-135m | stories260k | tiny-llama | tiny-gpt2")
    p.add_argument("--policy", action="append", required=True, metavar="P",
                   help="full, window, streaming, h2o, keyformer; repeat or comma-separate for several; "
                        "parameters as name:key=value,key=value (e.g. keyformer:noise=gaussian)")
    p.add_argument("--cache-ratios", type=_ratios, default=list(DEFAULT_RATIOS),
                   help="kept fraction of the prompt (default 0.1,...,1.0; full uses 1.0 only)")
    p.add_argument("--recent-ratio", type=float, default=None,
                   help="recent-window share of the budget for h2o/keyformer (default: the policy's own)")
    p.add_argument("--dataset", required=True,
                   help=f"{', '.join(DATASETS)}, long-text:NAME or jsonl:PATH")
    p.add_argument("--n", type=int, default=8, help="number of samples (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated or forced (default 32)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="cut longer documents to fit")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (default fp32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--teacher-forced", action="store_true", default=None,
                   help="force the reference tokens instead of generating (perplexity, top-1 agreement); "
                        "the default for long-text")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--detail", choices=("full", "summary"), default="full",
                   help="full: kv rows per layer and KV head plus kept positions; summary: one kv row per step "
                        "(means over layers and heads), no kept positions, for large quality runs (default full)")
    p.add_argument("--no-shared-prefill", action="store_true",
                   help="run every prompt forward under its policy instead of replaying one recorded full-"
                        "attention forward per sample (same results; use it to time real prefills)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="samples decoded together, left-padded (default 1). Larger batches run several times "
                        "faster on CPU; Keyformer's noise is then drawn per batch")
    p.add_argument("--long-text-chars", type=int, default=6000,
                   help="characters per long-text chunk: the first half is the prompt (default 6000)")
    p.add_argument("--out", required=True, help="trace folder to write (resumed if it holds the same capture)")
    p.add_argument("--overwrite", action="store_true", help="discard what --out holds and start over")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _policies(values: list[str]) -> list[str]:
    """`--policy full,h2o` and repeated flags; a comma inside `name:k=v,k=v` belongs to the parameters."""
    out = []
    for value in values:
        out.extend([value] if ":" in value else [v for v in value.split(",") if v.strip()])
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = CaptureConfig(model=args.model, policies=_policies(args.policy), dataset=args.dataset,
                               out=args.out, n=args.n, max_new_tokens=args.max_new_tokens,
                               cache_ratios=args.cache_ratios, recent_ratio=args.recent_ratio,
                               device=args.device, dtype=args.dtype, seed=args.seed,
                               max_prompt_tokens=args.max_prompt_tokens, threads=args.threads, teacher_forced=args.teacher_forced,
                               detail=args.detail, shared_prefill=not args.no_shared_prefill,
                               long_text_chars=args.long_text_chars, batch_size=args.batch_size,
                               overwrite=args.overwrite,
                               progress=not args.no_progress)
        from traces.capture import run_capture

        out = run_capture(config)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: finished runs are kept in {args.out}; rerun the same command to resume",
              file=sys.stderr)
        return 130
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
