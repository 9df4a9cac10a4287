"""`python -m keyformer ...` is `python -m keyformer.generate ...`."""
import sys

from keyformer.generate import main

sys.exit(main())
