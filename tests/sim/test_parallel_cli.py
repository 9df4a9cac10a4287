"""The issue-18 flags on sim.predict, sim.serve and sim.sweep: off by default, one-line errors, new keys only
when asked for (the goldens check that the defaults print what they always printed)."""
import json

import pandas as pd
import pytest

from sim import predict, serve, sweep

PREDICT = ["--hw", "h100-sxm", "--model", "llama-2-13b", "--prompt", "1024", "--gen", "32", "--batch", "4", "--json"]
SWEEP = ["--hw", "h100-sxm", "--models", "smollm2-135m", "--policies", "full,window", "--cache-ratios", "0.2,1.0",
         "--batches", "2", "--prompts", "256", "--gens", "16", "--traces", "none", "--no-cache", "--no-plots", "--csv"]


def _json(capsys, argv):
    assert predict.main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out[out.index("{"):])


def test_predict_keys_only_with_the_flags(capsys):
    plain = _json(capsys, PREDICT)
    assert not {"tp", "devices", "energy_j_per_token", "cost_per_mtok"} & set(plain)
    tp2 = _json(capsys, PREDICT + ["--tp", "2"])
    assert tp2["tp"] == 2 and tp2["devices"] == 2 and tp2["comm_decode_s"] > 0 and tp2["interconnect"] == "nvlink4"
    assert tp2["tpot_s"] < plain["tpot_s"]
    energy = _json(capsys, PREDICT + ["--energy", "--price-per-hour", "3.6"])
    assert set(plain) < set(energy) and energy["price_usd_per_hour"] == 3.6
    assert energy["cost_per_mtok"] == pytest.approx(1e3 / energy["tokens_per_s"])
    assert energy["energy_j_per_token"] == pytest.approx(sum(energy["decode_energy_breakdown_j_per_token"].values()))


def test_predict_text_lines(capsys):
    assert predict.main([a for a in PREDICT if a != "--json"] + ["--tp", "2", "--pp", "2", "--energy"]) == 0
    out = capsys.readouterr().out
    assert "tp 2 x pp 2 = 4 over nvlink4" in out and "per decoded token" in out and "USD per million" in out


@pytest.mark.parametrize("flags, fragment", [(["--tp", "0"], "--tp"), (["--price-per-hour", "-1"], "--price-per-hour"),
                                             (["--tp", "3"], "tp=3")])
def test_predict_bad_values_are_one_line(capsys, flags, fragment):
    from sim.cli import run
    assert run(predict.main, PREDICT + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0]


def test_serve_on_four_devices(capsys):
    argv = ["--hw", "h100-sxm", "--model", "llama-2-70b", "--prompt", "1024", "--gen", "32", "--requests", "8",
            "--json", "--no-progress"]
    assert serve.main(argv + ["--tp", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["tp"] == 4 and out["completed"] == 8
    assert serve.main(argv) == 2          # one H100 cannot hold the 70B weights
    assert "does not fit" in capsys.readouterr().err


def test_sweep_columns_only_with_the_flags(tmp_path):
    assert sweep.main(SWEEP + ["--out", str(tmp_path / "plain")]) == 0
    plain = pd.read_csv(tmp_path / "plain" / "points.csv")
    assert "tp" not in plain and "energy_j_per_token" not in plain
    assert sweep.main(SWEEP + ["--out", str(tmp_path / "tp"), "--tp", "3", "--energy"]) == 0
    tp = pd.read_csv(tmp_path / "tp" / "points.csv")
    assert (tp["tp"] == 3).all() and (tp["devices"] == 3).all() and tp["energy_j_per_token"].gt(0).all()
    assert list(tp.columns[:len(plain.columns) - len(sweep.OUTPUT_COLUMNS)]) == list(
        plain.columns[:len(plain.columns) - len(sweep.OUTPUT_COLUMNS)])
    assert (tp["weight_bytes_per_device"] < plain["weight_bytes"]).all()


def test_sweep_energy_figure(tmp_path):
    argv = [a for a in SWEEP if a != "--no-plots"] + ["--out", str(tmp_path), "--energy"]
    assert sweep.main(argv) == 0
    assert (tmp_path / "energy_cost.png").stat().st_size > 0
    frame = pd.read_csv(tmp_path / "energy_cost.csv")
    assert set(frame["policy"]) == {"window"} and frame["batch"].gt(0).all()


def test_sweep_yaml_keys_and_des_refusal(tmp_path):
    config = tmp_path / "grid.yaml"
    config.write_text("tp: 3\nenergy: true\nengine: des\n")
    with pytest.raises(ValueError, match="energy"):
        sweep.config_from_args(sweep.build_parser().parse_args(["--config", str(config)]))
    config.write_text("tp: 3\n")
    _, options = sweep.config_from_args(sweep.build_parser().parse_args(["--config", str(config)]))
    assert options.tp == 3 and options.parallel and not options.wants_energy
