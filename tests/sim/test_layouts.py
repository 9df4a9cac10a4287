"""sim.layouts: block accounting replayed from kept positions, checked against a direct block allocator
(refcounted blocks, allocated as tokens arrive, freed when the last token in them leaves)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim import engine
from sim.layouts import LAYOUTS, Layout, layout_table, layout_trace, with_compaction
from sim.layouts_report import freed_table, markdown, plot
from traces.reader import Trace

N, HEADS, LAYERS, STEPS, B = 40, 3, 2, 12, 8


def synthetic_trace(seed=0, keep=0.5, policy="h2o", samples=("s0", "s1")):
    """A per-head evicting policy on random positions: after the prefill each head keeps its own random
    keep*N prompt tokens; every decode step appends the new token and evicts one random token per head."""
    rng = np.random.default_rng(seed)
    kv, kept, held_log = [], [], {}
    k = int(keep * N)
    for sample in samples:
        for layer in range(LAYERS):
            for head in range(HEADS):
                held = set(rng.choice(N, size=k, replace=False).tolist())
                bits = np.zeros(N, dtype=bool)
                bits[list(held)] = True
                kept.append(dict(sample=sample, policy=policy, cache_ratio=keep, step=-1, layer=layer, head=head,
                                 kept_bitmap=np.packbits(bits).tobytes(), added=[], evicted=[]))
                held_log[(sample, layer, head, -1)] = set(held)
                kv.append(dict(sample=sample, policy=policy, cache_ratio=keep, step=-1, layer=layer, head=head,
                               prompt_len=N, kv_len=len(held), kept_prompt=len(held), mass_retained=1.0))
                for step in range(STEPS):
                    new = N + step
                    out = int(rng.choice(sorted(held)))
                    held.discard(out)
                    held.add(new)
                    kept.append(dict(sample=sample, policy=policy, cache_ratio=keep, step=step, layer=layer,
                                     head=head, kept_bitmap=None, added=[new], evicted=[out]))
                    held_log[(sample, layer, head, step)] = set(held)
                    kv.append(dict(sample=sample, policy=policy, cache_ratio=keep, step=step, layer=layer,
                                   head=head, prompt_len=N, kv_len=len(held),
                                   kept_prompt=sum(p < N for p in held), mass_retained=1.0))
    trace = Trace(path=None, manifest={"model": {"n_layers": LAYERS}}, kv=pd.DataFrame(kv),
                  steps=pd.DataFrame(), texts=pd.DataFrame())
    trace.__dict__["kept"] = pd.DataFrame(kept)       # the cached_property the reader fills from kept.parquet
    return trace, held_log


class BlockAllocator:
    """Blocks of B slots; a token takes the next slot of the open block (one slot for every head sharing
    the block); a block returns to the pool when no head holds a token in it."""

    def __init__(self, shared: bool):
        self.shared, self.live = shared, {}             # block id -> set of (head, position) it holds

    def blocks(self, held_by_head: dict[int, set[int]]) -> dict[int, int]:
        owner = {}
        for head, positions in held_by_head.items():
            for p in positions:
                block = (p // B) if self.shared else (head, p // B)
                owner.setdefault(block, set()).add((head, p))
        if self.shared:
            return {h: len(owner) for h in held_by_head}
        return {h: sum(1 for blk in owner if blk[0] == h) for h in held_by_head}


@pytest.mark.parametrize("layout", ["paged", "paged-head"])
def test_replay_matches_a_direct_block_allocator(layout):
    trace, log = synthetic_trace()
    table = layout_table(trace, Layout(layout, block_size=B)).set_index(["sample", "layer", "head", "step"])
    alloc = BlockAllocator(shared=layout == "paged")
    for sample in ("s0", "s1"):
        for layer in range(LAYERS):
            for step in range(-1, STEPS):
                held = {h: log[(sample, layer, h, step)] for h in range(HEADS)}
                expected = alloc.blocks(held)
                for h in range(HEADS):
                    row = table.loc[(sample, layer, h, step)]
                    assert row["kept"] == len(held[h])
                    assert row["kv_len"] == expected[h] * B


def test_slots_pay_what_they_keep_and_blocks_never_less():
    trace, _ = synthetic_trace()
    slots = layout_table(trace, Layout("slots"))
    head = layout_table(trace, Layout("paged-head", block_size=B))
    shared = layout_table(trace, Layout("paged", block_size=B))
    assert (slots["kv_len"] == slots["kept"]).all()
    assert (head["kv_len"] >= head["kept"]).all() and (shared["kv_len"] >= head["kv_len"]).all()


def test_compaction_packs_each_head_densely_and_counts_its_copies():
    trace, _ = synthetic_trace()
    every = 4
    t = layout_table(trace, Layout("paged", block_size=B, compact_every=every))
    at = t[(t["step"] == -1) | ((t["step"] + 1) % every == 0)]
    per_layer = at.groupby(["sample", "layer", "step"])
    for _, part in per_layer:       # right after a compaction: ceil(max kept / B) blocks, every kept token copied
        assert (part["kv_len"] == np.ceil(part["kept"].max() / B) * B).all()
        assert (part["copied"] == part["kept"]).all()
    assert (t.loc[~t.index.isin(at.index), "copied"] == 0).all()


def test_layout_changes_the_prediction_by_the_trace_arithmetic():
    """Through the kv_override seam: on the trace's own shape the paged layout's override is exactly the
    replayed paid slots (mean over heads and samples, per step and layer), and its prediction differs."""
    trace, _ = synthetic_trace(keep=0.25)
    paged, copied = layout_trace(trace, Layout("paged", block_size=B))
    assert copied == 0.0
    kw = dict(policy="h2o", cache_ratio=0.25, prompt=N, gen=STEPS, n_layers=LAYERS)
    slots_kv, paged_kv = trace.kv_override(**kw), paged.kv_override(**kw)
    t = layout_table(trace, Layout("paged", block_size=B))
    paid = np.minimum(t["kv_len"], t["prompt_len"] + t["step"] + 1)      # never more than the tokens that exist
    expected = t.assign(paid=paid).groupby(["step", "layer"])["paid"].mean().unstack().to_numpy()
    np.testing.assert_allclose(paged_kv, expected, rtol=1e-9)
    assert (paged_kv > slots_kv).all()
    # onto a 7B model and a 4000-token prompt: more KV read and held than the slot layout
    big = dict(kw, prompt=4000, n_layers=32)
    pred = lambda kv: engine.predict("h200-sxm", "llama-2-7b", 8, 4000, STEPS, "h2o", 0.25, kv_override=kv)
    a, b = pred(trace.kv_override(**big)), pred(paged.kv_override(**big))
    assert b.tpot_s > a.tpot_s and b.max_batch < a.max_batch and b.peak_memory_bytes > a.peak_memory_bytes


def test_compaction_is_charged_as_copies():
    trace, _ = synthetic_trace(keep=0.25)
    _, copied = layout_trace(trace, Layout("paged", block_size=B, compact_every=4))
    assert copied == pytest.approx(1 / 4, rel=0.2)      # every kept token copied once per 4 steps
    plain = engine.predict("h200-sxm", "llama-2-7b", 8, 4000, 64, "h2o", 0.25, profile="fused")
    charged = engine.predict("h200-sxm", "llama-2-7b", 8, 4000, 64, "h2o", 0.25,
                             profile=with_compaction("fused", copied))
    assert charged.tpot_s > plain.tpot_s
    assert "layout_compact" in set(charged.decode_ops.op)


def test_freed_table_orders_the_layouts_and_draws(tmp_path):
    trace, _ = synthetic_trace(keep=0.25)
    layouts = [Layout("slots"), Layout("paged-head", block_size=B), Layout("paged", block_size=B),
               Layout("paged", block_size=B, compact_every=4)]
    table = freed_table({"synthetic": trace}, layouts)
    shares = table.set_index(["layout", "compact_every"])["freed_share"]
    assert shares[("slots", 0)] >= shares[("paged-head", 0)] >= shares[("paged", 0)] >= 0.0
    assert shares[("paged", 4)] > shares[("paged", 0)]            # compaction gives the holes back
    assert shares[("slots", 0)] > 0.5 and (table["samples"] == 2).all()
    assert (table["freed_lo"] <= table["freed_share"]).all() and (table["freed_share"] <= table["freed_hi"]).all()
    text = markdown(table)
    assert "paged B=8 compact/4 freed %" in text and "| synthetic | h2o | 0.25 |" in text
    assert plot(table, tmp_path / "f.png").stat().st_size > 1000


def test_bad_layouts_are_one_line_errors():
    with pytest.raises(ValueError, match="name must be one of slots, paged, paged-head"):
        Layout("blocks")
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        Layout("paged", block_size=0)
    trace, _ = synthetic_trace()
    trace.__dict__["kept"] = pd.DataFrame()
    with pytest.raises(ValueError, match="no kept positions"):
        layout_table(trace, Layout("paged"))


def test_serve_admits_by_the_blocks_a_layout_keeps_alive():
    from sim.serve import simulate
    trace, _ = synthetic_trace(keep=0.25)
    kw = dict(prompt=4000, gen=STEPS, qps=float("inf"), requests=16, trace=trace, block_size=B)
    slots = simulate("h200-sxm", "llama-2-7b", "h2o", 0.25, **kw)
    paged = simulate("h200-sxm", "llama-2-7b", "h2o", 0.25, layout="paged", **kw)
    assert paged.config["layout"] == "paged" and "layout" not in slots.config   # slots: the config it always had
    assert paged.peak_kv_bytes > slots.peak_kv_bytes
    with pytest.raises(ValueError, match="layout and compact_every need a trace"):
        simulate("h200-sxm", "llama-2-7b", "h2o", 0.25, prompt=100, gen=4, requests=2, layout="paged")


def test_sweep_options_and_trace_points_carry_the_layout(monkeypatch):
    from sim import traced
    from sim.sweep.options import RunOptions
    opts = RunOptions(traces=[], trace_layouts=["slots", "paged"], trace_block_size=B, trace_compact_every=4)
    assert opts.layouts() == [Layout("slots"), Layout("paged", block_size=B, compact_every=4)]
    with pytest.raises(ValueError, match="trace_layouts: name must be one of slots, paged, paged-head"):
        RunOptions(trace_layouts=["blocks"])
    with pytest.raises(ValueError, match="trace_block_size"):
        RunOptions(trace_layouts=["paged"], trace_block_size=0)
    trace, _ = synthetic_trace(keep=0.25)
    monkeypatch.setattr(traced, "load_trace", lambda path, identity=None: trace)
    traced.layout_trace.cache_clear()
    traced.kv_override.cache_clear()
    base = dict(hw="h200-sxm", model="llama-2-7b", policy="h2o", policy_label="h2o", cache_ratio=0.25,
                recent_ratio=0.3, batch=4, beams=1, prompt=4000, gen=STEPS, kv_dtype="bf16", weight_dtype="bf16",
                profile="fused", trace_path="synthetic", trace_hash="synthetic")
    points = pd.DataFrame([dict(base, layout="slots", block_size=B, compact_every=0),
                           dict(base, layout="paged", block_size=B, compact_every=0),
                           dict(base, layout="paged", block_size=B, compact_every=4)])
    out = traced.evaluate(points)
    slots, paged, compacted = out.itertuples(index=False)
    assert paged.max_batch < slots.max_batch and paged.tpot_s > slots.tpot_s
    assert slots.max_batch >= compacted.max_batch > paged.max_batch
    traced.layout_trace.cache_clear()
    traced.kv_override.cache_clear()
