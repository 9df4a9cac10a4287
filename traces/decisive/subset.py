"""`python -m traces.decisive.subset --out FILE`: the XSum articles the pre-registered experiment
teacher-forces, as a jsonl dataset for traces.capture (`--dataset jsonl:FILE`).

traces.capture forces the same number T of reference tokens on every sample, so a sample whose gold summary
is shorter cannot be forced. The subset is fixed in advance: the first `--n` articles of XSum's seeded order
(`traces.datasets.load_samples("xsum", 1000, seed)`) whose gold summary has at least T tokens under the
model's tokenizer, each with its XSum id, the same instruction and the same document, so their prompts are
the `xsum` dataset's."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kvcommon.cli import OneLineParser, atomic_write_text, run

MODEL = "smollm2-135m"


def build(n: int, tokens: int, seed: int = 0, model: str = MODEL) -> tuple[list[dict], int]:
    """(records, articles skipped for a short summary)."""
    from transformers import AutoTokenizer

    from traces.datasets import load_samples
    from traces.models import smollm2_folder

    if model != MODEL:
        raise ValueError(f"the subset is defined with {MODEL}'s tokenizer, not {model!r}")
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_folder()), local_files_only=True)
    records, skipped = [], 0
    for sample in load_samples("xsum", 1000, seed):
        if len(tokenizer(sample.reference, add_special_tokens=False).input_ids) < tokens:
            skipped += 1
            continue
        records.append({"id": sample.id, "text": sample.document, "instruction": sample.instruction,
                        "reference": sample.reference})
        if len(records) == n:
            return records, skipped
    raise ValueError(f"only {len(records)} XSum articles have >= {tokens} summary tokens (asked for {n})")


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m traces.decisive.subset", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="jsonl file to write")
    parser.add_argument("--n", type=int, default=400, help="articles (default 400)")
    parser.add_argument("--tokens", type=int, default=16, help="forced tokens T (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="XSum's shuffle seed (default 0, the captures')")
    args = parser.parse_args(argv)
    if args.n < 1 or args.tokens < 1:
        parser.error("--n and --tokens must be >= 1")
    records, skipped = build(args.n, args.tokens, args.seed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in records))
    print(f"{out}: {len(records)} articles ({skipped} skipped: summary under {args.tokens} tokens)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
