"""Eager attention's GEMVs over the KV cache vs the weight-GEMV streaming rate. Pure numpy, no torch.

At decode, eager attention runs q @ K^T and p @ V as batched GEMVs (one query row per KV head)
over the whole cache. The simulator charges every streaming op bytes / (memory_bw x bw_efficiency),
a curve fitted on weight GEMVs; with narrow heads the attention GEMVs stream slower than that
(their inner loop is only head_dim long). Per head width d, the fraction of that curve they reach:

    f(d) = median over K sizes of bytes / (memory_bw x bw_efficiency(bytes) x (time - launch))

each point capped at 1 (never faster than the streaming curve: bytes / bandwidth is the simulator's
physical floor). The engine divides the memory time of its attn_scores / attn_v ops by f at the
model's head width (hwmodels Device.attn_scores_factor / attn_values_factor).
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


def width_fraction(series, memory_bw: float, bw_curve, launch: float) -> float:
    """Median over sizes of the rate reached relative to the streaming curve at the same size."""
    sizes = series.sizes()
    fractions = raw_efficiency(sizes, series.seconds(), memory_bw * np.asarray(bw_curve(sizes)), launch)
    return round_fraction(float(np.median(fractions)))


def fit_attention(series: dict, primary_dtype: str, memory_bw: float, bw_curve, launch: float) -> dict:
    """kind ("scores", "values") -> AttnTable over the measured head widths; kinds without series
    are left out (older plans, CUDA quick)."""
    out = {}
    for kind, (prefix, _, _) in KINDS.items():
        names = sorted((n for n, s in series.items() if n.startswith(f"{prefix}_{primary_dtype}_d") and s.points),
                       key=head_dim_of)
        if not names:
            continue
        widths = tuple(head_dim_of(n) for n in names)
        fractions = tuple(width_fraction(series[n], memory_bw, bw_curve, launch) for n in names)
        out[kind] = AttnTable(TableCurve(widths, fractions, monotone=False), ", ".join(names))
    return out


def attention_documents(attention: dict, source) -> dict:
    """The hardware-file tables of fit_attention's result; `source(detail)` builds a source string."""
    docs = {}
    for kind, table in attention.items():
        _, key, what = KINDS[kind]
        docs[key] = table_document(table.curve, "head_dim", source(
            f"{table.series}: {what} over a KV cache per head width; fraction = median over K sizes of "
            "bytes / (memory_bandwidth x bw_efficiency(bytes) x (median time - launch_overhead)), "
            "each point capped at 1"))
    return docs
