"""sim.energy_plot: energy and cost against the cache ratio at the largest batch that fits."""
import pandas as pd

from sim import energy_plot


def test_table_and_files(tmp_path, capsys):
    rc = energy_plot.main(["--hw", "l4,cpu-local", "--model", "smollm2-135m", "--policy", "window",
                           "--cache-ratios", "0.2,0.5,1.0", "--prompt", "1024", "--gen", "64", "--out", str(tmp_path)])
    assert rc == 0
    frame = pd.read_csv(tmp_path / "energy_cost.csv")
    assert (tmp_path / "energy_cost.png").stat().st_size > 0
    l4 = frame[frame.hw == "l4"].sort_values("cache_ratio")
    assert (l4.batch > 0).all() and l4.batch.is_monotonic_decreasing          # less KV kept: more requests fit
    assert l4.energy_j_per_token.is_monotonic_increasing and l4.cost_per_mtok.is_monotonic_increasing
    cpu = frame[frame.hw == "cpu-local"]
    assert cpu.energy_j_per_token.isna().all() and cpu.note.str.contains("no energy data").all()


def test_bad_input_is_one_line(capsys):
    assert energy_plot.main(["--hw", "nonesuch", "--cache-ratios", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
