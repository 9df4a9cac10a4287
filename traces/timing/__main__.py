"""`python -m traces.timing` (traces.timing.cli)."""
import sys

from traces.timing.cli import main

sys.exit(main())
