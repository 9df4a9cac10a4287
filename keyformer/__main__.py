"""`python -m keyformer ...` is `python -m keyformer.generate ...` (keyformer.cli)."""
import sys

from keyformer.cli import main

sys.exit(main())
