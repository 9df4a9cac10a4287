"""The collectives of tensor and pipeline parallelism, timed over an interconnect (sim/parallel/__init__.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim import engine
from sim.models import ModelSpec
from sim.ops import Op

COMM_OPS = ("tp_allreduce", "tp_embed_allreduce", "tp_logits_gather", "pp_send")


def allreduce_link_bytes(message_bytes, tp: int):
    """Bytes one device sends (and receives) in a ring all-reduce of a message: 2(tp-1)/tp x message."""
    return 2.0 * (tp - 1) / tp * np.asarray(message_bytes, float)


def allgather_link_bytes(total_bytes, tp: int):
    """Bytes one device receives in an all-gather whose result is `total_bytes`: (tp-1)/tp x total."""
    return (tp - 1) / tp * np.asarray(total_bytes, float)


def allreduce_time(link, message_bytes, tp: int):
    """Seconds of one all-reduce (no launch): the faster of a ring and recursive doubling."""
    if tp == 1:
        return np.zeros_like(np.asarray(message_bytes, float))
    n, bw, a = np.asarray(message_bytes, float), link.effective_bw, link.latency_s
    ring = 2 * (tp - 1) * a + allreduce_link_bytes(n, tp) / bw
    steps = math.ceil(math.log2(tp))
    doubling = steps * (a + n / bw)
    return np.minimum(ring, doubling)


def allgather_time(link, total_bytes, tp: int):
    if tp == 1:
        return np.zeros_like(np.asarray(total_bytes, float))
    steps = min(tp - 1, math.ceil(math.log2(tp)))
    return steps * link.latency_s + allgather_link_bytes(total_bytes, tp) / link.effective_bw


def p2p_time(link, message_bytes):
    return link.latency_s + np.asarray(message_bytes, float) / link.effective_bw


@dataclass
class Collective:
    """One kind of collective of a step on one device: the Op row (its HBM traffic and reduction FLOPs,
    for the energy tables), the bytes it puts on the links and its time (launches included)."""
    op: Op
    count: float                # occurrences per step
    link_bytes: object          # per step, per device (sent)
    time_s: object              # per step


def collectives(model: ModelSpec, stage: ModelSpec, tokens, tp: int, pp: int, link, act_bytes: float,
                launch_s: float, logits_rows=None) -> list[Collective]:
    """The collectives of one step of `tokens` token rows on one device of the largest stage."""
    tokens = np.asarray(tokens, float)
    rows = tokens if logits_rows is None else np.asarray(logits_rows, float)
    hidden = tokens * model.d_model * act_bytes
    out = []
    if tp > 1:
        per_layer = 2.0 * stage.n_layers                 # after attention and after the MLP
        adds = (tp - 1) / tp * tokens * model.d_model     # reduce-scatter additions per element
        for name, count, n in (("tp_allreduce", per_layer, hidden), ("tp_embed_allreduce", 1.0, hidden)):
            op = Op(name, name == "tp_allreduce", flops=count * adds, act_bytes=count * 3.0 * n, launches=count)
            out.append(Collective(op, count, count * allreduce_link_bytes(n, tp),
                                  count * (allreduce_time(link, n, tp) + launch_s)))
        logits = rows * model.vocab_size * act_bytes
        op = Op("tp_logits_gather", False, act_bytes=2.0 * logits, launches=1.0)
        out.append(Collective(op, 1.0, allgather_link_bytes(logits, tp), allgather_time(link, logits, tp) + launch_s))
    if pp > 1:
        op = Op("pp_send", False, act_bytes=2.0 * hidden, launches=1.0)
        out.append(Collective(op, 1.0, hidden, p2p_time(link, hidden) + launch_s))
    return out


def comm_table(colls: list[Collective], model: ModelSpec, stage: ModelSpec, tp: int, pp: int,
               passes: float = 1.0) -> pd.DataFrame:
    """Collectives as operator-table rows (engine TABLE_COLUMNS plus link_bytes), summed over the deployment:
    the per-layer all-reduces on every device of every stage, the embedding all-reduce and logits gather once
    per TP group, the stage sends at the pp - 1 boundaries by every TP rank; x `passes` micro-batch passes."""
    scales = {"tp_allreduce": tp * model.n_layers / stage.n_layers, "tp_embed_allreduce": tp,
              "tp_logits_gather": tp, "pp_send": tp * (pp - 1)}
    rows = []
    for c in colls:
        o, k = c.op, scales[c.op.name] * passes
        rows.append(dict(op=o.name, flops=k * float(o.flops), weight_bytes=0.0, act_bytes=k * float(o.act_bytes),
                         kv_read_bytes=0.0, kv_write_bytes=0.0, intensity=0.0, bound="link",
                         time_s=float(c.time_s), link_bytes=k * float(c.link_bytes)))
    return pd.DataFrame(rows, columns=[*engine.TABLE_COLUMNS, "link_bytes"])


def bubble_factor(micro_batches, pp: int):
    """Decode cycle length against a full pipeline: max(M, pp) / M (1: no bubble)."""
    m = np.asarray(micro_batches, float)
    return np.maximum(m, pp) / m
