"""`python -m sim.sweep` (the flags and main are in sim.sweep.cli)."""
import sys

from sim.cli import run
from sim.sweep.cli import main

sys.exit(run(main))
