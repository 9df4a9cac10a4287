"""What the CLIs say (issue 17): help shows defaults and choices once; latencies in readable units;
output folders are not created silently; a run of hours is announced; context limits; progress bars
only on a terminal."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest

from hwmodels.cli import progress_disabled
from sim import cli, predict, serve
from sim.models import load_model

PY = sys.executable


def test_predict_help_shows_defaults_and_choices(capsys):
    with pytest.raises(SystemExit):
        predict.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one of full, window, streaming, h2o, keyformer, snapkv, tova, mass, pyramidkv, adakv, or a variant" in text
    assert "(default: full)" in text and "keyformer:selection=official" in text
    assert "one of fp32, bf16, fp16, fp8, int8, int4 (default: bf16)" in text
    assert "hf-eager" in text and "(default: auto)" in text and "(default: 0.3)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_serve_help_says_each_default_once(capsys):
    with pytest.raises(SystemExit):
        serve._parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 100, or the whole file)" in text
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "(default: 16)" in text and "(default: memory decides)" in text
    assert "(default: memory decides) (default" not in text and "whole file) (default" not in text


@pytest.mark.parametrize("seconds, text", [(812e-6, "812 us"), (0.05498, "54.98 ms"), (22.0277, "22.03 s"),
                                           (78.27, "1.3 min"), (3 * 3600, "3.0 h"), (None, "-"),
                                           (float("nan"), "-")])
def test_durations_read_in_their_unit(seconds, text):
    assert cli.duration(seconds) == text


def test_serve_report_latencies_in_human_units(capsys):
    rc = serve.main(["--hw", "a100-80g-sxm", "--model", "mpt-7b", "--requests", "40", "--qps", "inf",
                     "--prompt", "4096", "--gen", "256", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "latency (ms)" not in out
    ttft = next(line for line in out.splitlines() if line.startswith("TTFT")).split()[1:]
    assert len(ttft) == 8 and set(ttft[1::2]) <= {"us", "ms", "s", "min", "h"}
    assert {"s", "min"} & set(ttft[1::2])                    # seconds in the queue: not 20000.00 (ms)


def test_serve_timeline_into_a_missing_folder_is_an_error(tmp_path, capsys):
    target = tmp_path / "no" / "such" / "tl.csv"
    rc = serve.main(["--hw", "a100-80g-sxm", "--model", "mpt-7b", "--requests", "5", "--prompt", "128",
                     "--gen", "8", "--timeline", str(target), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: --timeline: folder") and err.count("\n") == 1
    assert not (tmp_path / "no").exists()
    rc = serve.main(["--hw", "a100-80g-sxm", "--model", "mpt-7b", "--requests", "5", "--prompt", "128",
                     "--gen", "8", "--per-request", str(tmp_path), "--no-progress"])
    assert rc == 2 and "is a folder" in capsys.readouterr().err


def test_serve_announces_a_run_of_hours():
    assert serve.run_estimate(100, 512) is None
    line = serve.run_estimate(100_000_000, 512)
    assert "100,000,000 requests x 512 output tokens: roughly" in line and " h " in line


def test_serve_warns_past_the_trained_context(capsys):
    rc = serve.main(["--hw", "a100-80g-sxm", "--model", "mpt-7b", "--requests", "2", "--prompt", "4096",
                     "--gen", "8", "--no-progress", "--json"])
    err = capsys.readouterr().err
    assert rc == 0 and "warning: --prompt + --gen = 4104 tokens exceeds mpt-7b's trained context of 2048" in err
    rc = serve.main(["--hw", "a100-80g-sxm", "--model", "gpt2", "--requests", "2", "--prompt", "1024",
                     "--gen", "8", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "learned absolute positions for 1024 tokens" in err and err.count("\n") == 1


def test_predict_learned_positions_beyond_context_is_an_error(capsys):
    rc = cli.run(predict.main, ["--hw", "a100-80g-sxm", "--model", "gpt2", "--prompt", "4096", "--gen", "16"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: prompt + gen = 4112 tokens, but gpt2 has learned absolute positions")
    rc = cli.run(predict.main, ["--hw", "a100-80g-sxm", "--model", "llama-2-7b", "--prompt", "4096", "--gen", "16",
                                "--json"])
    captured = capsys.readouterr()
    assert rc == 0 and "warning: prompt + gen = 4112 tokens exceeds llama-2-7b's trained context" in captured.err
    assert cli.check_context(load_model("gpt2"), 1024) is None


def test_progress_bars_only_on_a_terminal(monkeypatch):
    monkeypatch.delenv("KVSIM_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_disabled() is True and progress_disabled(False) is True
    monkeypatch.setenv("KVSIM_PROGRESS", "1")
    assert progress_disabled() is False and progress_disabled(False) is True
    tty = io.StringIO()
    tty.isatty = lambda: True
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setenv("KVSIM_PROGRESS", "0")
    assert progress_disabled() is True
    monkeypatch.delenv("KVSIM_PROGRESS")
    assert progress_disabled() is False


def test_no_bar_in_a_log_file(tmp_path):
    log = tmp_path / "log.txt"
    with log.open("w") as fh:
        proc = subprocess.run([PY, "-m", "sim.serve", "--hw", "a100-80g-sxm", "--model", "mpt-7b", "--requests",
                               "30", "--prompt", "512", "--gen", "64", "--json"], stdout=subprocess.DEVNULL,
                              stderr=fh, env={**__import__("os").environ, "KVSIM_PROGRESS": ""})
    assert proc.returncode == 0 and "req/s" not in log.read_text() and "\r" not in log.read_text()
