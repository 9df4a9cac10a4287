"""`python -m tests.golden.regenerate`: rewrite tests/golden/data/ (only for a change that moves
predictions on purpose; commit it alone and say why)."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.golden.cases import DATA, ROOT, cases, run_case, write_golden


def main() -> int:
    DATA.mkdir(exist_ok=True)
    for case in cases():
        if case.needs and not (ROOT / case.needs).exists():
            print(f"skip {case.name}: {case.needs} absent", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            text = run_case(case, Path(tmp) / "out")
        write_golden(case, text)
        print(f"{case.name}: {len(text):,} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
