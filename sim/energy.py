"""Energy per token from an operator table and a device's power terms (hwmodels.platform.Energy).

The power model, per device: P = P_static + e_byte x (device-memory bytes/s) + e_flop(dtype) x (FLOP/s),
capped at the board limit (TDP); the energy of a step is P x its wall time. So:
- every byte an op moves in device memory (weights, KV reads and writes, activations) costs e_byte, the
  DRAM access with its trip through L2 to the cores (`dram_energy` + the optional `onchip_energy`);
- every FLOP costs the FLOP energy of its dtype: ops that read weights (the weight GEMMs; norms, whose few
  FLOPs do not matter) at the weight dtype, the others at the activation dtype; a dtype the file does not
  list draws the listed dtype's power at its own dense peak (hwmodels.platform.Energy.flop_energy);
- bytes a collective puts on the links (`link_bytes` column of sim.parallel tables) cost e_byte once more
  at the receiver (the link's own signalling energy is not modelled);
- static power x wall time x devices: what a serving device draws whatever its step does (clocks at
  speed, leakage, memory refresh, the work between kernels);
- a step whose demand exceeds TDP x wall x devices is capped there (all parts scaled alike, `power_capped`):
  a real board clocks down instead, so such a step also takes longer than the latency model says.
The three terms are fitted on measured power (`python -m sim.fit_energy`, ML.ENERGY v3 rows) for the
devices measured there and transferred to the others by documented physics (docs/parallel-energy-cost.md).

Breakdown: weights, kv, activations (their bytes), compute (FLOPs), comm (link bytes), static.
Decode energy per token = one decode step (the mean over the request's steps) / the output tokens it
makes (batch; beams add work, not tokens); prefill energy per token = the prefill / the prompt tokens it
reads (batch x prompt); per output token = (prefill + (gen - 1) decode steps) / (batch x gen).
The device is the prediction's own loaded Device (a user's file keeps its own `<stem>.platform.yaml`); a
device without energy data gives None (`energy_summary` says so in a `note`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from hwmodels.platform import Energy, load_energy

PARTS = ("weights", "kv", "activations", "compute", "comm", "static")
KEYS = ("energy_j_per_token", "prefill_energy_j_per_token", "energy_j_per_output_token",
        "decode_energy_breakdown_j_per_token", "prefill_energy_breakdown_j_per_token", "decode_power_w_per_device",
        "power_capped", "prefill_power_capped")


def _act_dtype(weight_dtype: str) -> str:
    # the engine's rule (sim.engine.activation_dtype): fp32 weights run fp32 activations, all others bf16
    return "fp32" if weight_dtype == "fp32" else "bf16"


def table_energy(table: pd.DataFrame, energy: Energy, device, weight_dtype: str) -> dict:
    """Dynamic energy (J) of the ops in `table` by part (no static): weights, kv, activations, compute, comm."""
    per_byte = energy.j_per_byte
    e_weight = energy.flop_energy(weight_dtype, device)
    e_act = energy.flop_energy(_act_dtype(weight_dtype), device)
    reads_weights = table["weight_bytes"].to_numpy(float) > 0
    flops = table["flops"].to_numpy(float)
    link = table["link_bytes"].to_numpy(float) if "link_bytes" in table else np.zeros(len(table))
    return dict(weights=float(table["weight_bytes"].sum()) * per_byte,
                kv=float((table["kv_read_bytes"] + table["kv_write_bytes"]).sum()) * per_byte,
                activations=float(table["act_bytes"].sum()) * per_byte,
                compute=float(np.where(reads_weights, flops * e_weight, flops * e_act).sum()),
                comm=float(link.sum()) * per_byte)


def cap_at_tdp(parts: dict, wall_s: float, tdp_w: float | None, devices: int = 1) -> dict:
    """`parts` (J by PART) with `total`, scaled down alike when their power exceeds the TDP (`power_capped`)."""
    total = sum(parts[p] for p in PARTS)
    limit = tdp_w * float(wall_s) * devices if tdp_w else float("inf")
    scale = limit / total if total > limit else 1.0
    out = {p: parts[p] * scale for p in PARTS}
    out["total"], out["power_capped"] = total * scale, scale < 1.0
    return out


def step_energy(table: pd.DataFrame, wall_s: float, energy: Energy, device, weight_dtype: str,
                devices: int = 1) -> dict:
    """Energy (J) of one step by part, static included (static power x wall_s x devices), `total` and
    `power_capped` (the demand exceeded TDP x wall_s x devices and was capped there)."""
    parts = table_energy(table, energy, device, weight_dtype)
    parts["static"] = energy.static_w * float(wall_s) * devices
    return cap_at_tdp(parts, wall_s, energy.tdp_w, devices)


def _mean_decode(ops: pd.DataFrame) -> pd.DataFrame:
    return ops[ops["step"] == "mean"] if "step" in ops else ops


def prediction_device(prediction, hw=None):
    """The loaded Device a prediction was made on (sim.engine.Prediction.device, or its sim.parallel stage's);
    `hw` (a Device or a path) overrides. A bare name is loaded only when it is a shipped file's own name: a
    name that merely resembles a SKU must not borrow that SKU's figures."""
    from hwmodels import load_device
    from hwmodels.shipped import list_devices
    if hw is None:
        hw = getattr(prediction, "device", None) or getattr(getattr(prediction, "stage", None), "device", None)
    if hw is None:
        hw = prediction.inputs["hw"]
        if str(hw) not in list_devices():
            raise ValueError(f"energy and cost of device {hw!r}: the prediction carries no loaded device and "
                             "the name is no shipped file; pass the Device")
    return load_device(hw) if isinstance(hw, str) or not hasattr(hw, "peak_flops") else hw


def energy_summary(prediction, hw=None, energy: Energy | None = None) -> dict:
    """Energy outputs of an engine or sim.parallel prediction: energy_j_per_token (decode),
    prefill_energy_j_per_token, energy_j_per_output_token, breakdowns (J per token by part), average power
    per device (never above the TDP) and whether the demand was capped there, and `energy_source` (the file
    the terms come from). No energy data: every number None with a `note`."""
    device = prediction_device(prediction, hw)
    energy = energy if energy is not None else load_energy(device)
    inputs = prediction.inputs
    if energy is None:
        own = own_platform_file(device)
        return {**dict.fromkeys(KEYS), "energy_source": None,
                "energy_note": f"no energy data for {device.name}" + (f" (add an energy section to {own})" if own
                                                                      else " (hwmodels/platform)")}
    devices = int(prediction.extra.get("devices", 1))
    wd = inputs["weight_dtype"]
    batch, prompt, gen = inputs["batch"], inputs["prompt"], inputs["gen"]
    decode = step_energy(_mean_decode(prediction.decode_ops), prediction.tpot_s, energy, device, wd, devices)
    prefill = step_energy(prediction.prefill_ops, prediction.ttft_s, energy, device, wd, devices)
    steps = max(gen - 1, 0)
    total = prefill["total"] + steps * decode["total"]
    power = decode["total"] / prediction.tpot_s / devices if prediction.tpot_s > 0 else None
    per = lambda parts, tokens: {p: parts[p] / tokens for p in PARTS}
    return dict(energy_j_per_token=decode["total"] / batch if steps else None,
                prefill_energy_j_per_token=prefill["total"] / (batch * prompt),
                energy_j_per_output_token=total / (batch * gen),
                decode_energy_breakdown_j_per_token=per(decode, batch) if steps else None,
                prefill_energy_breakdown_j_per_token=per(prefill, batch * prompt),
                decode_power_w_per_device=power,
                power_capped=bool(decode["power_capped"]), prefill_power_capped=bool(prefill["power_capped"]),
                energy_source=display_path(energy.file),
                energy_note="model: static power + bytes x J/byte + FLOPs x J/FLOP, capped at the TDP")


def own_platform_file(device) -> str | None:
    """`<stem>.platform.yaml` next to a device file outside the shipped folder (where a user puts figures)."""
    from pathlib import Path
    from hwmodels import DEVICES_DIR
    source = getattr(device, "source_path", None)
    if not source or Path(source).resolve().parent == Path(DEVICES_DIR).resolve():
        return None
    return str(Path(source).with_name(f"{Path(source).stem}.platform.yaml"))


def display_path(path) -> str:
    """A platform file as reports name it: repository-relative when shipped, else as given."""
    from sim.validation.analysis import repo_relative
    return repo_relative(path) if path else ""
