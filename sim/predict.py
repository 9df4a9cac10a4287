"""`python -m sim.predict`: latency, throughput, memory and capacity of one design point.

    python -m sim.predict --hw a100-80g-sxm --model mpt-7b --batch 1 --prompt 4096 --gen 4096 \\
        --policy keyformer --cache-ratio 0.5 --beams 4 --kv-dtype fp16 --weight-dtype fp16 --breakdown
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd

from kvcommon import DesignPoint
from kvcommon.fields import add_flags, from_args
from sim import policies
from sim.cli import ArgumentParser, DefaultsHelpFormatter, check_context, run
from sim.engine import Prediction, predict
from sim.layouts import LAYOUT_FLAGS, Layout, apply_layout
from sim.parallel import cli as deployment
from sim.policies import NAMES as POLICIES
from sim.policies import variants


def profile_names() -> list[str]:
    """Registered software-stack profiles, plugins included (for --help)."""
    from sim import profiles
    try:
        profiles.load_all()
    except Exception:   # a broken plugin is reported when it is used, not in --help
        pass
    return sorted(profiles.PROFILES)


# The design-point flags come from kvcommon.DesignPoint's fields (one default, one check per parameter).
DESIGN_FLAGS = ("hw", "model", "batch", "prompt", "gen", "policy", "cache_ratio", "recent_ratio", "kv_dtype",
                "weight_dtype", "profile", "beams")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m sim.predict", description=__doc__.split("\n")[0],
                       formatter_class=DefaultsHelpFormatter)
    # --policy takes variants (sim.policies.variants); --cache-ratio / --recent-ratio unset: the one rule there
    add_flags(p, DesignPoint, DESIGN_FLAGS, required=("hw", "model", "prompt", "gen"),
              defaults={"cache_ratio": None, "recent_ratio": None},
              help={"profile": f"software-stack profile, one of {', '.join(profile_names())} (fused: ideal kernels)",
                    "policy": variants.policy_help(POLICIES), "cache_ratio": variants.CACHE_RATIO_HELP,
                    "recent_ratio": variants.RECENT_RATIO_HELP})
    p.add_argument("--trace", metavar="DIR", help="take per-step, per-layer KV lengths from a captured trace")
    p.add_argument("--trace-heads", default=None, choices=("mean", "max"),
                   help="with --trace: per layer, the mean KV head (a ragged attention kernel) or the fullest one "
                        "(a kernel padded to the longest head), as sim.serve --trace-heads (default mean)")
    add_flags(p, Layout, LAYOUT_FLAGS)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--breakdown", action="store_true", help="print the per-operator tables")
    deployment.add_flags(p)
    return p


def design_point(a) -> DesignPoint:
    """The checked design point of the parsed flags (--policy as a variant); a bad value is one line naming
    its flag."""
    return variants.design_point(a, POLICIES)[0]


def trace_override(trace_dir: str, policy: str, cache_ratio: float, prompt: int, gen: int, n_layers: int,
                   layout: Layout = Layout(), profile="auto", heads: str = "mean") -> tuple[np.ndarray, object]:
    """(the trace's kept tokens per step and layer mapped onto this point, the profile to time it with):
    in `layout`, the slots the kept tokens pay for (sim.layouts; traces.load, no torch)."""
    try:
        import traces
        trace, profile = apply_layout(traces.load(trace_dir), layout, profile)
        return np.asarray(trace.kv_override(policy=policy, cache_ratio=cache_ratio, prompt=prompt, gen=gen,
                                            n_layers=n_layers, heads=heads), dtype=float), profile
    except Exception as exc:   # any failure reading a trace is a problem with the user's folder
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"trace {trace_dir}: {message}") from None


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def _time(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"


def format_table(df: pd.DataFrame) -> str:
    total = df["time_s"].sum()
    out = pd.DataFrame({
        "op": df["op"], "FLOPs": df["flops"].map(lambda v: _si(v, "")),
        "weights": df["weight_bytes"].map(lambda v: _si(v, "B")), "acts": df["act_bytes"].map(lambda v: _si(v, "B")),
        "KV read": df["kv_read_bytes"].map(lambda v: _si(v, "B")),
        "KV write": df["kv_write_bytes"].map(lambda v: _si(v, "B")),
        "FLOP/B": df["intensity"].map(lambda v: "-" if not np.isfinite(v) else f"{v:.1f}"), "bound": df["bound"],
        "time": df["time_s"].map(_time), "share": (df["time_s"] / total).map(lambda v: f"{100 * v:.1f}%"),
    })
    return out.to_string(index=False)


def format_summary(pred: Prediction) -> str:
    i, x = pred.inputs, pred.extra
    policy = i["policy"] if i["policy"] == "full" else \
        f"{i['policy']}, cache ratio {i['cache_ratio']:g} (recent {i['recent_ratio']:g})"
    kv_src = " [KV lengths from trace]" if i["kv_source"] == "trace" else ""
    if "layout" in i:
        every = f", compacted every {i['compact_every']} steps" if i["compact_every"] else ""
        kv_src += f" [{i['layout']} layout, {i['block_size']}-token blocks{every}]"
    kv_peak = pred.peak_memory_bytes - x["weight_bytes"]
    lines = [
        f"{i['model']} on {i['hw']} ({i['profile']} profile): {policy}{kv_src}",
        f"static batch {i['batch']} x beams {i['beams']} (started and decoded together), prompt {i['prompt']} + "
        f"gen {i['gen']} tokens, "
        f"weights {i['weight_dtype']}, KV {i['kv_dtype']}",
        f"  TTFT            {_time(pred.ttft_s)}",
        f"  TPOT (mean)     {_time(pred.tpot_s)}   decode is {x['decode_bound']}-bound",
        f"  end-to-end      {_time(pred.e2e_s)}",
        f"  tokens/s        {pred.tokens_per_s:,.1f}",
        f"  peak memory     {_gib(pred.peak_memory_bytes)} of {_gib(x['device_memory_bytes'])} "
        f"(weights {_gib(x['weight_bytes'])}, KV + workspace {_gib(kv_peak)})"
        + ("" if x["fits"] else f"   DOES NOT FIT as a static batch of {i['batch']} (see max batch)"),
        f"  KV per token    {x['kv_bytes_per_token'] / 1024:g} KiB (all layers, one sequence); "
        f"peak {x['peak_kv_tokens']:,.0f} tokens per sequence",
        # two capacities: requests in flight once continuous batching settles (they are at different steps,
        # so fewer are at their peak KV) vs a static batch that holds every request's peak at once
        f"  max batch       {pred.max_batch} requests in flight (continuous batching, steady state) -> "
        f"{pred.max_batch_tokens_per_s:,.1f} tokens/s; as a static batch (all at once): "
        f"{pred.max_batch_all_at_once} -> {pred.max_batch_all_at_once_tokens_per_s:,.1f} tokens/s",
    ]
    if "n_experts" in x:
        rows = i["batch"] * i["beams"]
        lines.append(f"  experts         {x['decode_experts_touched']:.1f} of {x['n_experts']} per layer read by a decode "
                     f"step of {rows} row{'' if rows == 1 else 's'}: {_gib(x['decode_weight_bytes_read'])} of the "
                     "weights streamed (uniform routing)")
    formula_note = getattr(policies.get(i["policy"]), "formula_note", "")
    if formula_note and i["kv_source"] == "formula":
        lines.append(f"note: {formula_note}")
    if x.get("exceeds_max_positions"):
        lines.append(f"note: prompt + gen = {i['prompt'] + i['gen']} exceeds the model's trained context; "
                     "the numbers are a what-if")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    point = design_point(a)
    # the simulator's policy string is the variant's label (a trace's rows are read under it)
    a.kv_dtype, a.weight_dtype, a.policy = point.kv_dtype, point.weight_dtype, point.variant.label
    a.cache_ratio, a.recent_ratio = point.cache_ratio, point.recent_ratio
    from sim.models import load_model
    note = check_context(load_model(a.model), a.prompt + a.gen, "prompt + gen")
    if note and a.json:     # the text summary carries its own note
        print(f"warning: {note}", file=sys.stderr)
    layout = from_args(Layout, a)
    if a.trace_heads is not None and not a.trace:
        raise ValueError("--trace-heads picks how a trace's KV heads are read: add --trace")
    if not layout.is_plain and not a.trace:
        raise ValueError("--layout/--compact-every need --trace: the block accounting replays a trace's kept "
                         "positions")
    from sim.profiles import resolve_profile_name
    a.profile = resolve_profile_name(a.profile, a.hw)      # `auto`: the device's default, named in the output
    override, profile = None, a.profile
    if a.trace:
        override, profile = trace_override(a.trace, a.policy, a.cache_ratio, a.prompt, a.gen,
                                           load_model(a.model).n_layers, layout, a.profile, a.trace_heads or "mean")
    kw = dict(recent_ratio=a.recent_ratio, kv_dtype=a.kv_dtype, weight_dtype=a.weight_dtype, profile=profile,
              kv_override=override, beams=a.beams)
    deployment.check_micro_batches(a)
    if deployment.wants_parallel(a):      # tp x pp devices (sim.parallel); without the flags: one device, as before
        from sim import parallel
        pred = parallel.predict(a.hw, a.model, a.batch, a.prompt, a.gen, a.policy, a.cache_ratio, **kw, tp=a.tp,
                                pp=a.pp, micro_batches=a.micro_batches)
    else:
        pred = predict(a.hw, a.model, a.batch, a.prompt, a.gen, a.policy, a.cache_ratio, **kw)
    if not layout.is_plain:
        pred.inputs.update(layout=layout.name, block_size=layout.block_size, compact_every=layout.compact_every)
    extras = deployment.energy_cost(pred, a) if deployment.wants_energy(a) else {}
    if a.json:
        out = {**pred.to_dict(), **extras}
        if a.breakdown:
            out["prefill_ops"] = _records(pred.prefill_ops)
            out["decode_ops"] = _records(pred.decode_ops)
        print(json.dumps(out, default=_jsonable))
        return 0
    print(format_summary(pred))
    for line in deployment.summary_lines(pred, extras):
        print(line)
    if a.breakdown:
        print(f"\nprefill ({_time(pred.ttft_s)} with host overhead):")
        print(format_table(pred.prefill_ops))
        for step in ("mean", "first", "last"):
            table = pred.decode_ops[pred.decode_ops["step"] == step]
            if step == "mean":
                print(f"\ndecode step, mean over the {max(a.gen - 1, 0)} decode steps:")
                print(format_table(table))
            else:
                print(f"\ndecode step, {step}: ops total {_time(table['time_s'].sum())}")
    return 0


def _records(df: pd.DataFrame) -> list[dict]:
    """Table rows for JSON: infinite intensity (no bytes moved) becomes null."""
    clean = df.replace([np.inf, -np.inf], np.nan).astype(object)
    return clean.where(clean.notna(), None).to_dict(orient="records")


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v) if np.isfinite(v) else None
    return str(v)


if __name__ == "__main__":
    sys.exit(run(main))
