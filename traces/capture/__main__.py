"""python -m traces.capture: run a model under KV policies over a dataset and write a trace folder."""
from __future__ import annotations

import os
import sys

# OpenMP reads this when torch starts: set it before anything imports torch (docs/ARCHITECTURE.md).
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

from kvcommon.cli import OneLineParser, check_out_folder, run
from kvcommon.fields import add_flags, from_args
from kvcommon.variants import split_variants
from traces.capture import CaptureConfig


def build_parser() -> OneLineParser:
    """The flags are CaptureConfig's fields (help, checks and defaults declared there once)."""
    p = OneLineParser(prog="python -m traces.capture",
                      description="Capture KV traces (kept tokens, retained attention mass, step times, texts).")
    add_flags(p, CaptureConfig, ["model"])
    import keyformer     # the one registry of policies (torch loads here, after OMP_WAIT_POLICY is set)
    p.add_argument("--policy", action="append", required=True, metavar="P", dest="policies",
                   help=f"{', '.join(keyformer.POLICIES)}; repeat or comma-separate for several; parameters "
                        "as name:key=value,key=value (e.g. keyformer:noise=gaussian, keyformer:selection=official, "
                        "h2o:recent_ratio=0.2): the policy class's fields")
    add_flags(p, CaptureConfig, ["cache_ratios", "recent_ratio", "dataset", "n", "max_new_tokens",
                                 "max_prompt_tokens", "device", "dtype", "seed", "teacher_forced", "threads",
                                 "detail"])
    p.add_argument("--no-shared-prefill", action="store_true",
                   help="run every prompt forward under its policy instead of replaying one recorded full-"
                        "attention forward per sample (same results; use it to time real prefills)")
    add_flags(p, CaptureConfig, ["batch_size", "long_text_chars", "out", "overwrite", "part"])
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _policies(values: list[str]) -> list[str]:
    """`--policy full,h2o` and repeated flags; a comma inside `name:k=v,k=v` belongs to the parameters."""
    return split_variants(values)


def main(argv=None) -> int:
    """The capture; a user mistake is one `error:` line and exit code 2 (kvcommon.cli.run)."""
    return run(_capture, argv)


def _capture(argv) -> int:
    args = build_parser().parse_args(argv)
    check_out_folder("--out", args.out)     # an existing file, a path under one: before the model loads
    config = from_args(CaptureConfig, args, policies=_policies(args.policies),
                       shared_prefill=not args.no_shared_prefill, progress=not args.no_progress)
    from traces.capture import run_capture
    try:
        out = run_capture(config)
    except KeyboardInterrupt:
        print(f"interrupted: finished runs are kept in {args.out}; rerun the same command to resume",
              file=sys.stderr)
        return 130
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
