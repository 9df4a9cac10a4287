"""Timing mode of the capture: decode-step (and prefill) latency of the project's own policies.

What it measures: the wall time of one `keyformer.generate.decode_one_token` call (embedding, every layer
with the policy's slot cache, attention, eviction bookkeeping, LM head, greedy pick) for a batch whose
requests each hold a context of `n` tokens, and optionally the wall time of a prefill. Models are built
from configs with *random* weights: latency does not depend on the weights' values, and this way any
shape can be timed without downloads. Long contexts need no prefill: `synthetic_state` builds the state a
prefill would leave (random K/V, policy bookkeeping initialised), so a 4096-token point costs a few
decode steps, not a 4096-token prefill.

    python -m traces.timing --model gpt2-small-rand --model llama-gqa-rand --model wide-mha-rand
    python -m traces.timing --model tiny-gpt2 --batch 1 --context 64 --policy full --out /tmp/t

Output, one timing folder per model under `--out` (default `traces/data/cpu`), in the format of
traces.timing_format (manifest.json of kind "kvsim-timing", config.json, timing.parquet and timing.csv).
The folder is rewritten atomically after every point; an interrupted run keeps finished points and a
rerun measures only the missing ones (it refuses to mix points measured under different settings).

Rounds (`--rounds R`): the machine drifts (a shared VM's memory bandwidth moves by tens of percent over tens
of seconds), so a point measured once samples one phase. With R > 1 the grid is visited round-robin, every
model and point once per round, and each row's statistics are over the samples of all its rounds (raw
samples are kept, so a rerun with a higher R adds rounds). `--calibrate FILE.yaml` runs the hwmodels
microbenchmarks before every model of every round and writes FILE.yaml as their median: the hardware file then describes
the same phases the points saw (its inputs are still microbenchmarks only, never the points).

The Hugging Face stack (`--stack hf --beams 4`): the same folders, but each decode point is the wall time
of one step of transformers' own `generate` with beam search (DynamicCache growth by torch.cat, beam
reorder by index_select, eager attention), read between consecutive stopping-criteria calls; the manifest
names the `hf-eager` profile, so sim.validate predicts these points with it. No eviction policy exists
there (--policy full only) and every point pays a real prefill of batch x beams x context tokens.

    python -m traces.timing --stack hf --beams 4 --out traces/data/cpu-hf --rounds 3

Timing discipline: OMP_WAIT_POLICY=ACTIVE is set before torch loads (unless the caller set it), the thread
count is fixed (`--threads`, default 1: on a shared 2-core machine one thread is the setting whose timings
do not collapse when a neighbour takes a core), every point runs warm-up steps first and reports the
median over repeats (and p10/p90 so the spread is visible).

Modules: grid (what is measured), configs (which models, built with random weights), measure (one point),
rounds (the grid round-robin, folders written point by point), calibration (--calibrate), cli.
"""
from __future__ import annotations

import os

# Before torch (and its OpenMP runtime) loads: idle OpenMP threads otherwise sleep between small ops and
# the wake-up cost lands in every measured step.
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")

from traces.timing.cli import build_parser, default_hw, main  # noqa: E402
from traces.timing.configs import build_model, max_positions, resolve_config  # noqa: E402
from traces.timing.grid import PolicyPoint, TimingGrid  # noqa: E402
from traces.timing_format import KEY_COLUMNS, KIND, TIMING_COLUMNS, TimingError, TimingFolder  # noqa: E402

__all__ = ["KEY_COLUMNS", "KIND", "TIMING_COLUMNS", "PolicyPoint", "TimingError", "TimingFolder", "TimingGrid",
           "build_model", "build_parser", "default_hw", "main", "max_positions", "resolve_config"]
