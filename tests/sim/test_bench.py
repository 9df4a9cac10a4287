"""`python -m sim.bench`: evaluates N random points and prints points per second on its last line."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sim.bench import random_points
from sim.cli import run
from sim.bench import main
from tests.sim.conftest import real_device_names

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not real_device_names(), reason="hwmodels devices not shipped yet")


def test_random_points_are_valid_and_reproducible():
    a, b = random_points(500, seed=3), random_points(500, seed=3)
    assert a.equals(b) and len(a) == 500
    assert a["cache_ratio"].between(0, 1, inclusive="right").all() and (a["gen"] >= 1).all()


def test_bench_prints_points_per_second_last(capsys):
    assert run(main, ["--points", "3000", "--chunk", "1000"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    m = re.fullmatch(r"points_per_s=(\d+)", lines[-1])
    assert m and int(m.group(1)) > 0
    assert "3,000 points" in lines[-2]


def test_bench_bad_flag_is_one_line():
    done = subprocess.run([sys.executable, "-m", "sim.bench", "--points", "0"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
