"""Eager attention's GEMVs over the KV cache vs the weight-GEMV streaming rate. Pure numpy, no torch.

At decode, eager attention runs q @ K^T and p @ V as batched GEMVs (one query row per KV head)
over the whole cache. The simulator charges every streaming op bytes / (memory_bw x bw_efficiency),
a curve fitted on weight GEMVs; with narrow heads the attention GEMVs stream slower than that
(their inner loop is only head_dim long). Per head width d, the fraction of that curve they reach:

    f(d) = median over K sizes of bytes / (memory_bw x bw_efficiency(bytes) x (time - launch))

each point capped at 1 (never faster than the streaming curve: bytes / bandwidth is the simulator's
physical floor). The engine divides the memory time of its attn_scores / attn_v ops by f at the
model's head width (hwmodels Device.attn_scores_factor / attn_values_factor).

SDPA (torch.nn.functional.scaled_dot_product_attention, transformers' default attention) is one kernel
whose CPU decode path loops over (sequence, query head): a grouped-query model's K/V head is read once
per query head of its group, the repeats from cache. Its cost per (query head, key) over a cache streamed
from memory (16 query heads on 4 K/V heads, K/V rotating through the pool), at head width d, as a rate:

    g(d) = median over sizes of (4 d + 5) x query-head-keys / (fp32 peak x (time - launch))

(4 d: the q.k and p.v dots, 5: the softmax's max, subtract, exp, sum, divide per score; the FLOPs the
simulator counts for attn_scores + softmax + attn_v, sim/op.py). The hf profile runs those ops at g(d) of
the peak (hwmodels Device.sdpa_decode_efficiency), their bytes still at the streaming rate: the larger
time wins, so a multi-head model stays bandwidth-bound and a grouped one pays its per-query-head loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..curves import TableCurve
from .fit_tables import raw_efficiency, round_fraction, table_document

# kind -> (series prefix, hardware-file key, what the engine op computes)
KINDS = {
    "scores": ("attn_scores", "attn_scores_efficiency", "q @ K^T"),
    "values": ("attn_values", "attn_values_efficiency", "p @ V"),
}


@dataclass(frozen=True)
class AttnTable:
    curve: TableCurve      # head width -> fraction of the streaming curve (any shape)
    series: str            # the series it was fitted on, for the source string


def head_dim_of(name: str) -> int:
    """'attn_scores_fp32_d64' -> 64."""
    return int(name.rsplit("_d", 1)[1])


def width_series(series: dict, prefix: str, primary_dtype: str) -> list[str]:
    """The measured `<prefix>_<dtype>_d<width>` series' names, by head width."""
    return sorted((n for n, s in series.items() if n.startswith(f"{prefix}_{primary_dtype}_d") and s.points),
                  key=head_dim_of)


def width_fraction(series, memory_bw: float, bw_curve, launch: float) -> float:
    """Median over sizes of the rate reached relative to the streaming curve at the same size."""
    sizes = series.sizes()
    fractions = raw_efficiency(sizes, series.seconds(), memory_bw * np.asarray(bw_curve(sizes)), launch)
    return round_fraction(float(np.median(fractions)))


SDPA_PREFIX, SDPA_KEY = "sdpa_core", "sdpa_decode_efficiency"


def sdpa_flops_per_key(head_dim: int) -> float:
    """FLOPs per (query head, key) of a decode attention: q.k and p.v dots plus the softmax (sim/op.py)."""
    return 4.0 * head_dim + 5.0


def fit_sdpa(series: dict, primary_dtype: str, peak: float, launch: float) -> AttnTable | None:
    """Head width -> fraction of the fp32 peak SDPA's decode kernel reaches per (query head, key) over a
    streamed cache; None without sdpa_core series."""
    names = width_series(series, SDPA_PREFIX, primary_dtype)
    if not names:
        return None
    widths = tuple(head_dim_of(n) for n in names)
    fractions = []
    for name, d in zip(names, widths):
        s = series[name]
        flops = sdpa_flops_per_key(d) * s.sizes()
        fractions.append(round_fraction(float(np.median(raw_efficiency(flops, s.seconds(), peak, launch)))))
    return AttnTable(TableCurve(widths, tuple(fractions), monotone=False), ", ".join(names))


def fit_attention(series: dict, primary_dtype: str, memory_bw: float, bw_curve, launch: float,
                  peak: float | None = None) -> dict:
    """kind ("scores", "values", "sdpa") -> AttnTable over the measured head widths; kinds without
    series are left out (older plans, CUDA quick). `peak`: the fp32 rate SDPA's table is a fraction of."""
    out = {}
    for kind, (prefix, _, _) in KINDS.items():
        names = width_series(series, prefix, primary_dtype)
        if not names:
            continue
        widths = tuple(head_dim_of(n) for n in names)
        fractions = tuple(width_fraction(series[n], memory_bw, bw_curve, launch) for n in names)
        out[kind] = AttnTable(TableCurve(widths, fractions, monotone=False), ", ".join(names))
    sdpa = fit_sdpa(series, primary_dtype, peak, launch) if peak is not None else None
    if sdpa is not None:
        out["sdpa"] = sdpa
    return out


def attention_documents(attention: dict, source) -> dict:
    """The hardware-file tables of fit_attention's result; `source(detail)` builds a source string."""
    docs = {}
    for kind, table in attention.items():
        if kind == "sdpa":
            docs[SDPA_KEY] = table_document(table.curve, "head_dim", source(
                f"{table.series}: scaled_dot_product_attention at decode (one query token, 16 query heads on 4 "
                "K/V heads, K and V streamed from a cold pool) per head width; fraction = median over sizes of (4 d + 5) x "
                "query-head-keys / (peak_flops.fp32 x (median time - launch_overhead))"))
            continue
        _, key, what = KINDS[kind]
        docs[key] = table_document(table.curve, "head_dim", source(
            f"{table.series}: {what} over a KV cache per head width; fraction = median over K sizes of "
            "bytes / (memory_bandwidth x bw_efficiency(bytes) x (median time - launch_overhead)), "
            "each point capped at 1"))
    return docs
