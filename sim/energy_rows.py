"""The measured energy rows (`../shared/data/gpu-energy-train.csv`, ML.ENERGY leaderboard v3, vLLM 0.11.1)
and the work each row's devices did per second, for fitting sim.energy's power model (sim.fit_energy).

A row is a saturated vLLM server (1024 requests at once, `max_num_seqs` = the batch cap) with its measured
mean GPU power (the total over `num_gpus`), output tokens/s and energy per output token (= power / tokens/s).
The fit is of the power model, not of the latency model: each row's time is its measured rate, and only its
bytes and FLOPs come from the simulator's operator tables (the `fused` profile's, which count what the model
must move and compute; no fitted latency term enters). A cohort of `batch` requests (the measured mean batch)
of `prompt` + `avg_output_len` tokens is one prefill and output_len - 1 decode steps; it takes
batch x output_len / tokens_per_s seconds at the measured rate. Per device: its bytes and FLOPs (all devices'
over `num_gpus` for tensor-parallel rows, whose tables are deployment-wide) over that time.

The rows do not give the prompt length (LMArena prompts, variable): `DEFAULT_PROMPT` is an assumption, and
`python -m sim.fit_energy --prompt-tokens N` shows how the terms move with it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

CSV_NAME = "gpu-energy-train.csv"
DEFAULT_PROMPT = 256       # assumption: mean LMArena first-turn prompt of a few hundred tokens (not published)
COLUMNS = ("source", "hw", "model", "weight_dtype", "num_gpus", "tp", "batch", "avg_output_len",
           "energy_per_output_token_J", "avg_gpu_power_W", "output_tok_per_s")
FALLBACK_MODELS = Path(__file__).with_name("fit_energy_models")   # used only while sim/models lacks the spec
BYTE_COLUMNS = ("weight_bytes", "kv_read_bytes", "kv_write_bytes", "act_bytes")


@dataclass(frozen=True)
class EnergyRow:
    id: str
    hw: str                 # hardware file name
    model: object           # ModelSpec
    weight_dtype: str
    tp: int
    devices: int
    batch_cap: int          # max_num_seqs
    batch: float            # measured mean running batch
    output_len: float
    power_w: float          # mean power per device
    j_per_token: float      # measured energy per output token (all devices)
    tokens_per_s: float


def default_csv() -> Path:
    from sim.validation.published_gpu import data_dir
    return data_dir() / CSV_NAME


def _model(label: str):
    from sim.model_names import resolve_name
    from sim.models import load_model
    found = resolve_name(label)
    if found.spec is not None:
        return load_model(found.spec)
    fallback = FALLBACK_MODELS / f"{label.split('/')[-1].lower()}.json"   # a row's model sim/models lacks
    if fallback.is_file():
        return load_model(str(fallback))
    raise ValueError(f"model {label!r}: {found.reason}")


def load_rows(path=None) -> list[EnergyRow]:
    """Every row of the energy CSV, or one error naming the row that cannot be read."""
    from hwmodels.skus import resolve_sku
    from sim.validation.published_rows import read_data_csv
    path = Path(path) if path is not None else default_csv()
    table = read_data_csv(path, COLUMNS, "energy measurements")
    rows = []
    for i, r in enumerate(table.to_dict("records"), start=2):
        where = f"{path.name} line {i}"
        hw, why = resolve_sku(r["hw"])
        if hw is None:
            raise ValueError(f"{where}: hardware {r['hw']!r}: {why}")
        cap = re.match(r"\s*(\d+)", r["batch"])
        mean = re.search(r"measured avg ([\d.]+)", r["batch"])
        if cap is None:
            raise ValueError(f"{where}: batch {r['batch']!r} names no max_num_seqs")
        try:
            devices, tp = int(r["num_gpus"]), int(r["tp"])
            power, j, tps, out_len = (float(r[k]) for k in ("avg_gpu_power_W", "energy_per_output_token_J",
                                                            "output_tok_per_s", "avg_output_len"))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        model = _model(r["model"])
        rows.append(EnergyRow(id=f"{hw}/{model.name}/tp{tp}/b{cap.group(1)}", hw=hw, model=model,
                              weight_dtype=r["weight_dtype"].strip() or "bf16", tp=tp, devices=devices,
                              batch_cap=int(cap.group(1)), batch=float(mean.group(1)) if mean else float(cap.group(1)),
                              output_len=out_len, power_w=power / devices, j_per_token=j, tokens_per_s=tps))
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def _sums(table: pd.DataFrame) -> tuple[float, float]:
    cols = [*BYTE_COLUMNS, *(["link_bytes"] if "link_bytes" in table else [])]
    return float(table[cols].to_numpy(float).sum()), float(table["flops"].sum())


def work_rates(row: EnergyRow, prompt: int = DEFAULT_PROMPT) -> tuple[float, float]:
    """(device-memory bytes/s, FLOP/s) per device of the row at its measured rate (see the module doc)."""
    from sim import engine, parallel
    batch, gen = max(int(round(row.batch)), 1), max(int(round(row.output_len)), 2)
    args = (row.hw, row.model, batch, prompt, gen, "full", 1.0)
    kw = dict(weight_dtype=row.weight_dtype, kv_dtype=row.weight_dtype, profile="fused")
    p = parallel.predict(*args, **kw, tp=row.tp) if row.tp > 1 else engine.predict(*args, **kw)
    decode = p.decode_ops[p.decode_ops["step"] == "mean"]
    (b_pre, f_pre), (b_dec, f_dec) = _sums(p.prefill_ops), _sums(decode)
    seconds = batch * gen / row.tokens_per_s
    per_device = seconds * row.devices
    return (b_pre + (gen - 1) * b_dec) / per_device, (f_pre + (gen - 1) * f_dec) / per_device
