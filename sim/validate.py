"""`python -m sim.validate`: predictions against published results and measured runs, error in plain sight.

    python -m sim.validate                         # results/validate-<UTC timestamp>/validation-report.md + .png
    python -m sim.validate --update-docs           # regenerate the committed docs/validation-report.md + png
    python -m sim.validate --json                  # also print one JSON object (points, mape, max_error, ...)
    python -m sim.validate --out /tmp/v --measured traces/data/cpu --references my_refs.csv

Inputs:
  - published reference points: sim/references/*.csv, one citation per row (sim/validation/references.py);
  - measured timing folders: every folder under traces/data/ whose manifest.json says kind "kvsim-timing"
    (written by `python -m traces.timing`, CPU or GPU), predicted on the hardware file its manifest names.
Every point is predicted through the engine's public entries with the profile of the stack it ran.
"""
from __future__ import annotations

import sys

# The logic lives in the package sim/validation/ (cli, points, analysis, report); these are this
# command's public names.
from sim.validation.analysis import hardware_notes, setting_warnings  # noqa: F401
from sim.validation.cli import DEFAULT_OUT, DEFAULT_THRESHOLD, build_parser, main, output_folder  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
