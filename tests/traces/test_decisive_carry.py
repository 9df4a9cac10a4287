"""traces/decisive/run.sh carry-out / carry-in: finished shards travel to the next checkout in one archive,
half-written ones never do, shards already there are kept and a finished capture is left alone."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "traces" / "decisive" / "run.sh"


def _run(target, out, carry):
    env = {**os.environ, "OUT": str(out), "CARRY": str(carry)}
    return subprocess.run(["bash", str(SCRIPT), target], cwd=ROOT, env=env, capture_output=True, text=True)


def _shard(folder: Path, name: str, text: str = "{}") -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "kv.parquet").write_bytes(b"kv")
    (folder / name / "text.json").write_text(text)


@pytest.mark.skipif(shutil.which("xz") is None or shutil.which("tar") is None, reason="needs tar and xz")
def test_carry_out_then_in(tmp_path):
    out, carry = tmp_path / "out", tmp_path / "carry.tar.xz"
    shards = out / "cnndm" / "shards"
    _shard(shards, "h2o__r0.3000__a", '{"x": 1}')
    _shard(shards, ".keyformer__r0.3000__a.tmp")                    # half-written: must not travel
    (out / "cnndm" / "capture.json").write_text('{"n": 1}')
    done = _run("carry-out", out, carry)
    assert done.returncode == 0 and "1 finished capture runs" in done.stderr and carry.exists()

    fresh = tmp_path / "fresh"
    assert _run("carry-in", fresh, carry).returncode == 0
    assert (fresh / "cnndm" / "shards" / "h2o__r0.3000__a" / "text.json").read_text() == '{"x": 1}'
    assert not (fresh / "cnndm" / "shards" / ".keyformer__r0.3000__a.tmp").exists()
    assert (fresh / "cnndm" / "capture.json").exists()

    (fresh / "cnndm" / "shards" / "h2o__r0.3000__a" / "text.json").write_text('{"x": 2}')   # newer: kept
    assert _run("carry-in", fresh, carry).returncode == 0
    assert (fresh / "cnndm" / "shards" / "h2o__r0.3000__a" / "text.json").read_text() == '{"x": 2}'

    finished = tmp_path / "finished"
    (finished / "cnndm").mkdir(parents=True)
    (finished / "cnndm" / "manifest.json").write_text("{}")                # a finished capture: left alone
    assert _run("carry-in", finished, carry).returncode == 0
    assert not (finished / "cnndm" / "shards").exists()


@pytest.mark.skipif(shutil.which("xz") is None or shutil.which("tar") is None, reason="needs tar and xz")
def test_beam_shards_travel_too(tmp_path):
    out, carry = tmp_path / "out", tmp_path / "carry.tar.xz"
    beams = out / "beam4" / "shards"
    beams.mkdir(parents=True)
    (beams / "full__r1.0000__a.json").write_text('{"b": 1}')
    (beams / "h2o__r0.3000__a.json.tmp.json").write_text("half")             # half-written: must not travel
    _shard(out / "xsum-tf" / "shards", "full__r1.0000__a")
    (out / "xsum-tf" / "capture.json").write_text('{"n": 1}')
    done = _run("carry-out", out, carry)
    assert done.returncode == 0 and "1 finished capture runs, 1 beam runs" in done.stderr

    fresh = tmp_path / "fresh"
    assert _run("carry-in", fresh, carry).returncode == 0
    assert (fresh / "beam4" / "shards" / "full__r1.0000__a.json").read_text() == '{"b": 1}'
    assert not (fresh / "beam4" / "shards" / "h2o__r0.3000__a.json.tmp.json").exists()

    finished = tmp_path / "finished"
    (finished / "beam4").mkdir(parents=True)
    (finished / "beam4" / "report.md").write_text("done")                  # a finished subset: left alone
    assert _run("carry-in", finished, carry).returncode == 0
    assert not (finished / "beam4" / "shards").exists()


def test_carry_out_without_shards_and_unknown_targets_are_one_line_errors(tmp_path):
    empty = _run("carry-out", tmp_path / "none", tmp_path / "c.tar.xz")
    assert empty.returncode == 2 and empty.stderr.strip().count("\n") == 0 and "no shards" in empty.stderr
    bad = _run("bogus", tmp_path / "none", tmp_path / "c.tar.xz")
    assert bad.returncode == 2 and "unknown target" in bad.stderr
