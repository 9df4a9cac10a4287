"""The issue-18 flags of the sim CLIs: --tp, --pp, --micro-batches, --energy, --price-per-hour.

Each is off by default, so a command without them prints exactly what it printed before (tests/golden).
`add_flags(parser)` declares them; `wants_parallel(args)` / `wants_energy(args)` say whether a run uses
them; `energy_cost(prediction, args)` gives the energy and cost keys; `summary_lines` their text form.
"""
from __future__ import annotations

import argparse
import math

from kvcommon.cli import positive_int

DEPLOYMENT_KEYS = ("tp", "pp", "devices", "micro_batches", "bubble_factor", "comm_decode_s", "comm_prefill_s",
                   "kv_replication", "weight_bytes_per_device", "model_weight_bytes", "kv_bytes_per_token_per_device",
                   "interconnect", "waves", "e2e_in_waves_s", "tokens_per_s_in_waves")


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a price in USD per device-hour, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite price >= 0, got {text!r}")
    return value


def add_flags(p, *, micro_batches: bool = True, energy: bool = True, unset: bool = False) -> None:
    """`unset`: every default None (a sweep's flags override its YAML file only when given)."""
    g = p.add_argument_group("multi-device, energy and cost (issue 18; off by default)")
    one = None if unset else 1
    g.add_argument("--tp", type=positive_int, default=one, help="tensor-parallel devices (sim.parallel; default 1)")
    g.add_argument("--pp", type=positive_int, default=one, help="pipeline-parallel stages (sim.parallel; default 1)")
    if micro_batches:
        g.add_argument("--micro-batches", type=positive_int, default=None,
                       help="pipeline micro-batches (default: min(batch, pp))")
    if energy:
        g.add_argument("--energy", action="store_true", default=None if unset else False,
                       help="add energy per token (J, by weights/kv/activations/compute/comm/static) and cost per "
                            "million output tokens (hwmodels/platform data)")
        g.add_argument("--price-per-hour", type=_price, default=None, metavar="USD",
                       help="USD per device-hour for the cost (default: the device's documented price); implies --energy")


def check_micro_batches(a) -> None:
    """--micro-batches above --batch is a mistake (a batch splits into at most `batch` micro-batches), not
    something to clamp silently."""
    m, batch = getattr(a, "micro_batches", None), getattr(a, "batch", None)
    if m is not None and batch is not None and m > batch:
        raise ValueError(f"--micro-batches {m} exceeds --batch {batch}: a batch of {batch} splits into at most "
                         f"{batch} micro-batches")


def wants_parallel(a) -> bool:
    return a.tp * a.pp > 1 or getattr(a, "micro_batches", None) not in (None, 1)


def wants_energy(a) -> bool:
    return bool(getattr(a, "energy", False) or getattr(a, "price_per_hour", None) is not None)


def energy_cost(pred, a) -> dict:
    """Energy and cost keys of a prediction (engine or sim.parallel), on the prediction's own loaded device,
    with the decode energy and power at the largest batch that fits (`*_at_max_batch`; None for --trace runs,
    whose kept lengths were mapped at the given batch)."""
    from sim.cost import cost_summary
    from sim.energy import energy_summary
    out = {**energy_summary(pred), **cost_summary(pred, override=getattr(a, "price_per_hour", None))}
    at_max = _at_batch(pred, a, pred.max_batch) if out["energy_j_per_token"] is not None else None
    e = energy_summary(at_max) if at_max is not None else {}
    out.update(energy_j_per_token_at_max_batch=e.get("energy_j_per_token"),
               decode_power_w_per_device_at_max_batch=e.get("decode_power_w_per_device"))
    return out


def _at_batch(pred, a, batch: int):
    """The same point at another batch (same device object, flags and deployment), or None where it cannot be
    re-run from the flags (a trace's or layout's KV lengths) or nothing fits."""
    if batch <= 0 or getattr(a, "trace", None):
        return None
    if batch == pred.inputs["batch"]:
        return pred
    device = getattr(pred, "device", None) or pred.stage.device
    i = pred.inputs
    kw = dict(recent_ratio=i["recent_ratio"], kv_dtype=i["kv_dtype"], weight_dtype=i["weight_dtype"],
              profile=getattr(a, "profile", i["profile"]), beams=i["beams"])
    if wants_parallel(a):
        from sim import parallel
        return parallel.predict(device, a.model, batch, i["prompt"], i["gen"], i["policy"], i["cache_ratio"], **kw,
                                tp=a.tp, pp=a.pp, micro_batches=a.micro_batches)
    from sim import engine
    return engine.predict(device, a.model, batch, i["prompt"], i["gen"], i["policy"], i["cache_ratio"], **kw)


def deployment_keys(pred) -> dict:
    return {k: pred.extra[k] for k in DEPLOYMENT_KEYS if k in pred.extra}


def _time(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"


def _joules(j: float) -> str:
    return f"{j:.3g} J" if j >= 1 else f"{j * 1e3:.3g} mJ"


def summary_lines(pred, extras: dict | None = None) -> list[str]:
    """Text lines for a deployment (when tp x pp > 1 or micro-batched) and for the energy and cost keys."""
    x, lines = pred.extra, []
    if x.get("devices", 1) > 1 or x.get("micro_batches", 1) > 1:
        lines += [f"  devices         tp {x['tp']} x pp {x['pp']} = {x['devices']} over {x['interconnect']}; "
                  f"per device: weights {x['weight_bytes_per_device'] / 2**30:.2f} GiB, "
                  f"KV {x['kv_bytes_per_token_per_device'] / 1024:g} KiB per token"
                  + (f" (KV heads replicated x{x['kv_replication']:g})" if x["kv_replication"] > 1 else ""),
                  f"  collectives     {_time(x['comm_decode_s'])} per decode step, {_time(x['comm_prefill_s'])} "
                  f"per prefill" + (f"; pipeline of {x['micro_batches']:g} micro-batches, bubble "
                                    f"x{x['bubble_factor']:g}" if x["pp"] > 1 else "")]
        if x.get("waves", 1) > 1:
            lines.append(f"  in waves        {pred.inputs['batch']} requests do not fit at once on a device: "
                         f"{x['waves']} waves of at most {pred.max_batch_all_at_once}, "
                         f"{x['tokens_per_s_in_waves']:,.1f} tokens/s")
    if extras:
        if extras.get("energy_j_per_token") is not None:
            parts = extras["decode_energy_breakdown_j_per_token"]
            shares = ", ".join(f"{k} {100 * v / extras['energy_j_per_token']:.0f}%" for k, v in parts.items())
            at_max = extras.get("energy_j_per_token_at_max_batch")
            lines.append(f"  energy          {_joules(extras['energy_j_per_token'])} per decoded token ({shares}); "
                         f"{_joules(extras['energy_j_per_output_token'])} per output token with prefill; "
                         f"{extras['decode_power_w_per_device']:.0f} W per device"
                         + (" (capped at the TDP)" if extras.get("power_capped") else "")
                         + (f"; at the max batch {_joules(at_max)} per decoded token, "
                            f"{extras['decode_power_w_per_device_at_max_batch']:.0f} W" if at_max is not None else ""))
            lines.append(f"                  terms from {extras['energy_source']}")
        elif extras.get("energy_note"):
            lines.append(f"  energy          - ({extras['energy_note']})")
        if extras.get("cost_per_mtok") is not None:
            at_max = extras["cost_per_mtok_at_max_batch"]
            lines.append(f"  cost            {extras['cost_per_mtok']:.4g} USD per million output tokens"
                         + (f" ({at_max:.4g} at the max batch)" if at_max is not None else "")
                         + f" at {extras['price_usd_per_hour']:g} USD per device-hour ({extras['price_file']})")
        else:
            lines.append(f"  cost            - ({extras.get('price_source')})")
    return lines
