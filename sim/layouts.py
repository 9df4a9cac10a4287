"""KV layouts: what per-head eviction frees when the cache is stored in blocks, replayed from a trace's
kept positions.

Serving engines keep KV in fixed-size blocks. Three layouts:
  slots       per-head token slots (keyformer/'s slot cache): a head holds exactly the tokens it keeps;
  paged       blocks of B token slots shared by all KV heads of a layer (vLLM: one block holds every KV
              head of its layer): a block is live while any head of the layer keeps any token in it;
  paged-head  blocks of B token slots per KV head: live while that head keeps a token in it.
A token's slot is its position in arrival order (prompt tokens 0..n-1, then the generated ones) until a
compaction repacks every head's kept tokens densely; with `compact_every=N` the engine compacts after the
prefill and every N decode steps, and each compaction copies every kept token once (read + write), which
`with_compaction` charges as an operator.

The replay gives, per (sample, policy, ratio, step, layer, head), the token slots a head pays for in that
layout: `kv_len` = live blocks x B (paged: the layer's live blocks, the same for every head). A Trace whose
kv table carries those lengths (`layout_trace`) feeds the engine's kv_override seam unchanged, so memory,
max batch and the KV bytes a decode step reads follow the blocks (a paged kernel reads whole blocks).
Mapping onto another prompt length keeps the trace's ratio of paid slots to budget. For per-head scattered
selections (H2O, Keyformer) that ratio depends on the keep ratio, B and the heads per block, not on n (a
block stays live unless all of its B x heads slots were evicted); for contiguous selections (window,
streaming) the overhead is at most a block or two per head, so on prompts longer than the trace's it is
overstated.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvcommon.fields import at_least, param, validate
from sim.op import Op, OpContext
from sim.profiles import Profile, get_profile

LAYOUTS = ("slots", "paged", "paged-head")
DEFAULT_BLOCK_SIZE = 16     # vLLM's default block size (tokens per block)
LAYOUT_FLAGS = ("name", "block_size", "compact_every")   # Layout's fields, as --layout --block-size --compact-every
PREFILL_STEP = -1


@dataclass(frozen=True)
class Layout:
    """How a serving engine stores the KV of a trace-driven point (the flags of predict, serve and sweep)."""
    name: str = param("slots", flag="--layout", choices=LAYOUTS,
                      help="KV layout the trace's kept positions are stored in: slots (per-head token slots), "
                           "paged (blocks shared by a layer's KV heads, as vLLM), paged-head (blocks per KV head); "
                           "non-slot layouts need --trace")
    block_size: int = param(DEFAULT_BLOCK_SIZE, check=at_least(1), help="tokens per KV block (paged layouts)")
    compact_every: int | None = param(None, check=at_least(1), metavar="N",
                                      help="compact the blocks after the prefill and every N decode steps "
                                           "(charged as copies; default: never)")

    def __post_init__(self):
        validate(self)

    @property
    def is_plain(self) -> bool:
        """Slots without compaction: what every prediction without a layout already assumes."""
        return self.name == "slots" and self.compact_every is None


def apply_layout(trace, layout: Layout, profile):
    """(the trace to take kv_override from, the profile to time with) for `layout`: the slot layout as is,
    else the layout-adjusted trace and, with compaction, the profile plus its copies."""
    if layout.is_plain:
        return trace, profile
    adjusted, copied = layout_trace(trace, layout)
    return adjusted, with_compaction(profile, copied)


def _decode_bitmap(blob: bytes, length: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(blob, dtype=np.uint8))[:length].astype(bool)


NEVER = np.iinfo(np.int64).max


def held_matrix(prompt_len: int, n_steps: int, prefill: list[np.ndarray], added: list, evicted: list) -> np.ndarray:
    """(steps + 1, heads, positions) bool: which original positions each head holds after each step (row 0 =
    after the prefill). `prefill[h]` the positions held after the prefill; `added[h]`, `evicted[h]` arrays of
    (step, position) events."""
    heads, total = len(prefill), prompt_len + n_steps
    since = np.full((heads, total), NEVER)
    until = np.full((heads, total), NEVER)
    for h in range(heads):
        since[h, prefill[h]] = PREFILL_STEP
        if len(added[h]):
            since[h, added[h][:, 1]] = added[h][:, 0]
        if len(evicted[h]):
            until[h, evicted[h][:, 1]] = evicted[h][:, 0]
    steps = np.arange(PREFILL_STEP, n_steps)[:, None, None]
    return (since[None] <= steps) & (steps < until[None])


def paid_slots(held: np.ndarray, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """From held (steps + 1, heads, positions): (paid slots per step and head, tokens copied per step and
    head). A token's slot is its arrival order (its position) until a compaction (after the prefill and
    every `compact_every` decode steps) repacks each head's held tokens densely; tokens arriving later take
    the next slots, one per step shared by every head."""
    rows, heads, total = held.shape
    kept = held.sum(axis=2)
    copied = np.zeros((rows, heads))
    if layout.name == "slots":
        return kept.astype(float), copied
    slot = np.broadcast_to(np.arange(total), held.shape).copy()
    if layout.compact_every is not None:
        compacted = [r for r in range(rows) if r == 0 or r % layout.compact_every == 0]
        for i, r in enumerate(compacted):       # rows r .. next compaction - 1 use this packing
            stop = compacted[i + 1] if i + 1 < len(compacted) else rows
            ranks = np.cumsum(held[r], axis=1) - 1                       # dense per head, position order
            base = int(held[r].sum(axis=1).max())
            # tokens held at the compaction: their rank; later arrivals (position n + step) after the packing
            later = np.arange(total) - (total - rows + 1) - r   # token of step s (position n + s): s - r
            seg = np.where(held[r][None], ranks[None], base + later[None, None, :])
            slot[r:stop] = seg
            copied[r] = kept[r]
    B = layout.block_size
    blocks = np.where(held, slot // B, -1)
    n_blocks = int(blocks.max()) + 2 if blocks.size else 1
    if layout.name == "paged-head":
        live = np.zeros((rows, heads, n_blocks), dtype=bool)
        r_i, h_i, p_i = np.nonzero(held)
        live[r_i, h_i, blocks[r_i, h_i, p_i]] = True
        return live.sum(axis=2).astype(float) * B, copied
    live = np.zeros((rows, n_blocks), dtype=bool)
    r_i, h_i, p_i = np.nonzero(held)
    live[r_i, blocks[r_i, h_i, p_i]] = True
    return np.repeat(live.sum(axis=1, keepdims=True).astype(float) * B, heads, axis=1), copied


def _events(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    e = frame[["cell", "head", "step", column]].explode(column).dropna(subset=[column])
    return e.assign(**{column: e[column].astype(np.int64)})


def held_cells(trace, policies=None):
    """Per (sample, policy, ratio, layer) of the trace's kept positions: (sample, policy, ratio, layer,
    prompt_len, heads, held matrix (steps + 1, heads, positions))."""
    kept = trace.kept
    if "kept_bitmap" not in kept.columns or kept.empty:
        raise ValueError(f"{trace.path}: no kept positions (capture with --detail full)")
    if policies is not None:
        kept = kept[kept["policy"].isin(policies)]
    keys = ["sample", "policy", "cache_ratio", "layer"]
    kept = kept.assign(cell=kept.groupby(keys, sort=False).ngroup()).reset_index(drop=True)
    prompt_lens = trace.kv.groupby("sample")["prompt_len"].first()
    decode = kept[kept["step"] >= 0]
    add_frame, evict_frame = _events(decode, "added"), _events(decode, "evicted")
    adds, evicts = add_frame.groupby("cell").indices, evict_frame.groupby("cell").indices
    add_cols = (add_frame["head"].to_numpy(), add_frame["step"].to_numpy(), add_frame["added"].to_numpy())
    ev_cols = (evict_frame["head"].to_numpy(), evict_frame["step"].to_numpy(), evict_frame["evicted"].to_numpy())
    cells, steps, heads_col, bitmaps = (kept[c].to_numpy() for c in ("cell", "step", "head", "kept_bitmap"))
    for cell, idx in kept.groupby("cell", sort=False).indices.items():
        sample, policy, ratio, layer = (kept[k].iat[idx[0]] for k in keys)
        n = int(prompt_lens[sample])
        first = idx[steps[idx] == PREFILL_STEP]
        if first.size == 0:
            raise ValueError(f"{trace.path}: kept positions of {sample} {policy} layer {layer} start without "
                             "a prefill row")
        first = first[np.argsort(heads_col[first])]
        heads = heads_col[first]
        n_steps = int(steps[idx].max()) + 1
        held0 = [np.flatnonzero(_decode_bitmap(bitmaps[i], n)) for i in first]
        yield (sample, policy, ratio, layer, n, heads,
               held_matrix(n, n_steps, held0, _per_head(adds.get(cell), add_cols, heads),
                           _per_head(evicts.get(cell), ev_cols, heads)))


def _per_head(idx, cols, heads) -> list[np.ndarray]:
    """(step, position) events of each head of one cell."""
    if idx is None:
        return [np.empty((0, 2), dtype=np.int64) for _ in heads]
    h, st, pos = (c[idx] for c in cols)
    return [np.stack([st[h == head], pos[h == head]], axis=1) for head in heads]


def layout_tables(trace, layouts, policies=None) -> dict:
    """{layout: kv-table rows (sample, policy, cache_ratio, step, layer, head, prompt_len) with `kept`
    (tokens the head keeps), `kv_len` (slots it pays for in the layout) and `copied` (tokens a compaction
    copied)}; every layout from one replay of the kept positions."""
    parts = {layout: [] for layout in layouts}
    meta = []
    for sample, policy, ratio, layer, n, heads, held in held_cells(trace, policies):
        rows = held.shape[0]
        meta.append((sample, policy, ratio, layer, n, heads, rows, held.sum(axis=2)))
        for layout in layouts:
            parts[layout].append(paid_slots(held, layout))
    if not meta:
        raise ValueError(f"{trace.path}: no kept positions for policies {policies}")
    sizes = np.array([m[6] * len(m[5]) for m in meta])
    base = pd.DataFrame({
        "sample": np.repeat([m[0] for m in meta], sizes), "policy": np.repeat([m[1] for m in meta], sizes),
        "cache_ratio": np.repeat([m[2] for m in meta], sizes),
        "step": np.concatenate([np.repeat(np.arange(PREFILL_STEP, m[6] - 1), len(m[5])) for m in meta]),
        "layer": np.repeat([m[3] for m in meta], sizes),
        "head": np.concatenate([np.tile(m[5], m[6]) for m in meta]),
        "prompt_len": np.repeat([m[4] for m in meta], sizes),
        "kept": np.concatenate([m[7].ravel() for m in meta]).astype(float)})
    return {layout: base.assign(kv_len=np.concatenate([p[0].ravel() for p in parts[layout]]),
                                copied=np.concatenate([p[1].ravel() for p in parts[layout]]))
            for layout in layouts}


def layout_table(trace, layout: Layout, policies=None) -> pd.DataFrame:
    return layout_tables(trace, [layout], policies)[layout]


def layout_trace(trace, layout: Layout):
    """(trace, copied per step): the trace with each head's kv_len replaced by the slots it pays for in
    `layout` (kept_prompt scaled alike), for the engine's kv_override seam, and the compactions' copies per
    decode step as a fraction of the kept tokens (for `with_compaction`). Slots without compaction: the
    trace itself."""
    if layout.name == "slots" and layout.compact_every is None:
        return trace, 0.0
    table = layout_table(trace, layout)
    keys = ["sample", "policy", "cache_ratio", "step", "layer", "head"]
    kv = trace.kv.merge(table[keys + ["kv_len", "copied"]].rename(columns={"kv_len": "paid"}), on=keys,
                        how="left", validate="one_to_one")
    if kv["paid"].isna().any():
        raise ValueError(f"{trace.path}: kept positions do not cover every kv row")
    scale = kv["paid"] / kv["kv_len"].clip(lower=1)
    kv = kv.assign(kv_len=kv["paid"].round().astype(trace.kv["kv_len"].dtype),
                   kept_prompt=(kv["kept_prompt"] * scale).round().astype(trace.kv["kept_prompt"].dtype))
    return dataclasses.replace(trace, kv=kv.drop(columns=["paid", "copied"]), _series_cache={}), copied_fraction(table)


def copied_fraction(table: pd.DataFrame) -> float:
    """Tokens copied by compactions per decode step, as a fraction of the tokens kept (0 without)."""
    decode = table[table["step"] >= 0]
    kept = decode["kept"].sum()
    return float(decode["copied"].sum() / kept) if kept > 0 else 0.0


def with_compaction(profile, copied_per_step: float) -> Profile:
    """`profile` plus the compaction copies: every decode step, in every layer, `copied_per_step` x the
    held KV is read and written again (amortised over the compaction interval)."""
    base = get_profile(profile)
    if copied_per_step <= 0:
        return base
    inner = base.extra_decode_ops

    def decode_ops(ctx: OpContext) -> list[Op]:
        m = ctx.model
        held = ctx.rows * m.n_kv_heads * ctx.past_tokens * m.head_dim * ctx.kvb   # K (and V below)
        ops = list(inner(ctx)) if inner is not None else []
        return ops + [Op("layout_compact", True, kv_read_bytes=2 * held * copied_per_step,
                         kv_write_bytes=2 * held * copied_per_step, launches=2 * copied_per_step)]

    return dataclasses.replace(base, name=f"{base.name}+compact", extra_decode_ops=decode_ops)
