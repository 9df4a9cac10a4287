"""The trace folder format: file names, columns and their types (torch-free).

docs/traces.md explains every field; this module is the single source the writer (traces.capture) and the
reader (traces.reader) share, so they cannot drift apart.
"""
from __future__ import annotations

import pyarrow as pa

from kvcommon.variants import PolicyVariant

SCHEMA_VERSION = 1
KIND = "kvsim-trace"
TIMING_KIND = "kvsim-timing"   # a traces.timing folder (traces/timing_format.py reads and writes them)

MANIFEST = "manifest.json"
KV = "kv.parquet"
KEPT = "kept.parquet"
STEPS = "steps.parquet"
TEXTS = "texts.jsonl"
QUALITY_DIR = "quality"
QUALITY_CSV = "quality.csv"

# Step numbering: -1 is the state after prefill (the prompt processed, the first token predicted, the
# policy's first eviction done); step s >= 0 is decode step s, which feeds generated token s and predicts
# token s + 1. A row describes the cache *after* that step's eviction, i.e. what decode step s + 1 reads.
PREFILL_STEP = -1

# The key columns, shared so the three tables join on the same names and types: which run and step a
# row belongs to (sample x policy x cache_ratio x step), and for the per-head tables which KV head.
STEP_KEY = (
    ("sample", pa.string()),
    ("policy", pa.string()),
    ("cache_ratio", pa.float32()),
    ("step", pa.int32()),
)
HEAD_KEY = (
    *STEP_KEY,
    ("layer", pa.int16()),
    ("head", pa.int16()),
)

# One row per sample x policy x cache_ratio x step x layer x kv_head.
KV_SCHEMA = pa.schema([
    *HEAD_KEY,
    ("prompt_len", pa.int32()),
    ("kv_len", pa.int32()),  # tokens this KV head holds after the step's eviction
    ("kept_prompt", pa.int32()),  # how many of them are prompt tokens (the rest are generated ones)
    # Share of the full-cache attention probability of the next query (the token that step s + 1 feeds)
    # that falls on the tokens this head holds plus that query itself; mean over the head's query group.
    ("mass_retained", pa.float32()),
])

# Which original positions each KV head holds, delta-encoded to stay small: the step -1 row carries a
# bitmap of the kept prompt positions (numpy.packbits, big-endian bit order, prompt_len bits); every
# later row lists the positions that entered (`added`) and left (`evicted`) during that step.
KEPT_SCHEMA = pa.schema([
    *HEAD_KEY,
    ("kept_bitmap", pa.binary()),
    ("added", pa.list_(pa.int32())),
    ("evicted", pa.list_(pa.int32())),
])

# One row per sample x policy x cache_ratio x step (step -1 = prefill).
STEPS_SCHEMA = pa.schema([
    *STEP_KEY,
    ("phase", pa.string()),  # "prefill" | "decode"
    ("prompt_len", pa.int32()),
    ("kv_len_mean", pa.float32()),  # mean over layers and KV heads after the step
    ("kv_cache_bytes", pa.int64()),  # K and V bytes held by all layers after the step
    ("wall_s", pa.float64()),  # forward + eviction, synchronised on GPU
    ("peak_mem_bytes", pa.int64()),  # torch.cuda.max_memory_allocated during the step; -1 on CPU
    ("score_flops", pa.float64()),  # policy score-function work during the step (keyformer score_work)
    ("score_elems", pa.float64()),
    ("token", pa.int32()),  # the token this step's logits lead to (greedy pick or teacher-forced)
    ("top1", pa.int32()),  # argmax of this step's logits
    ("nll", pa.float32()),  # -log p(token) under this step's logits (nats)
])

TEXT_FIELDS = ("sample", "policy", "cache_ratio", "prompt_len", "generated", "reference", "tokens")

# Columns every reader relies on (older writers may add more, never fewer).
REQUIRED = {
    KV: [f.name for f in KV_SCHEMA],
    KEPT: [f.name for f in KEPT_SCHEMA],
    STEPS: [f.name for f in STEPS_SCHEMA],
}


def policy_label(name: str, params: dict | None = None) -> str:
    """The string a policy variant is stored under: `keyformer` or `keyformer(noise=gaussian)`.

    Only parameters that the user set explicitly are part of the label; cache_ratio and recent_ratio
    never are (they are columns / manifest fields).
    """
    return PolicyVariant(name, dict(params or {})).label
