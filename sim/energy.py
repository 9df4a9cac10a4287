"""Energy per token from an operator table and a device's energy figures (hwmodels.platform.Energy).

Energy of a step = dynamic + static:
- every byte an op moves in device memory (weights, KV reads and writes, activations) costs the DRAM energy
  per byte plus the on-chip movement per byte (L2/SRAM and the wires to the cores, which every DRAM byte
  crosses once);
- every FLOP costs the FLOP energy of its dtype: ops that read weights (the weight GEMMs; norms, whose few
  FLOPs do not matter) at the weight dtype, the others at the activation dtype;
- bytes a collective puts on the links (`link_bytes` column of sim.parallel tables) cost the DRAM and
  on-chip energy once more at the receiver (the link's own signalling energy is not modelled);
- static power x wall time x devices (the device draws it whatever it does: leakage, clocks, refresh).

Breakdown: weights, kv, activations (their DRAM + on-chip bytes), compute (FLOPs), comm (link bytes), static.
Decode energy per token = one decode step (the mean over the request's steps) / the output tokens it
makes (batch; beams add work, not tokens); prefill energy per token = the prefill / the prompt tokens it
reads (batch x prompt); per output token = (prefill + (gen - 1) decode steps) / (batch x gen).
A device without energy data gives None (`energy_summary` says so in a `note`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from hwmodels.platform import Energy, load_energy

PARTS = ("weights", "kv", "activations", "compute", "comm", "static")


def _act_dtype(weight_dtype: str) -> str:
    # the engine's rule (sim.engine.activation_dtype): fp32 weights run fp32 activations, all others bf16
    return "fp32" if weight_dtype == "fp32" else "bf16"


def table_energy(table: pd.DataFrame, energy: Energy, device, weight_dtype: str) -> dict:
    """Dynamic energy (J) of the ops in `table` by part (no static): weights, kv, activations, compute, comm."""
    per_byte = energy.dram_j_per_byte + energy.onchip_j_per_byte
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


def step_energy(table: pd.DataFrame, wall_s: float, energy: Energy, device, weight_dtype: str,
                devices: int = 1) -> dict:
    """Energy (J) of one step by part, static included (static power x wall_s x devices), and `total`."""
    parts = table_energy(table, energy, device, weight_dtype)
    parts["static"] = energy.static_w * float(wall_s) * devices
    parts["total"] = sum(parts[p] for p in PARTS)
    return parts


def _mean_decode(ops: pd.DataFrame) -> pd.DataFrame:
    return ops[ops["step"] == "mean"] if "step" in ops else ops


def energy_summary(prediction, hw=None, energy: Energy | None = None) -> dict:
    """Energy outputs of an engine or sim.parallel prediction: energy_j_per_token (decode),
    prefill_energy_j_per_token, energy_j_per_output_token, breakdowns (J per token by part), average power
    per device and whether it exceeds the TDP. No energy data: every number None with a `note`."""
    from sim import engine
    inputs = prediction.inputs
    device = engine.resolve_device(hw if hw is not None else inputs["hw"])
    energy = energy if energy is not None else load_energy(device)
    keys = ("energy_j_per_token", "prefill_energy_j_per_token", "energy_j_per_output_token",
            "decode_energy_breakdown_j_per_token", "prefill_energy_breakdown_j_per_token", "decode_power_w_per_device",
            "exceeds_tdp")
    if energy is None:
        return {**dict.fromkeys(keys), "energy_note": f"no energy data for {device.name} (hwmodels/platform)"}
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
                exceeds_tdp=bool(power is not None and energy.tdp_w is not None and power > energy.tdp_w),
                energy_note="model: DRAM + on-chip bytes, FLOPs by dtype, static power (hwmodels/platform)")
