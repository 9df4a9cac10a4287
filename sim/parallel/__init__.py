"""Tensor (TP) and pipeline (PP) parallelism: one model over tp x pp devices joined by an interconnect.

Sharding (pure functions over `sim.models.ModelSpec`, Megatron-style as vLLM and TensorRT-LLM run it):
- TP splits every layer over `tp` ranks: query heads n_heads/tp, KV heads n_kv_heads/tp, or one KV head per
  rank replicated tp/n_kv_heads times when n_kv_heads < tp (each rank keeps the KV head its query heads
  read), MLP width d_ff/tp, vocabulary (embedding and LM head) vocab/tp. Norms are replicated.
- PP gives each of `pp` stages a contiguous run of layers (the first stages take the remainder); the first
  stage holds the embedding, the last the LM head, so each device holds at most one vocabulary matrix.
- One device is modelled as the largest stage: its layers, one vocabulary matrix for memory, and the
  embedding and LM head both in its step time (the last stage, which also samples, bounds the pipeline).

Collectives per step, on every device, timed over `hwmodels.platform.Interconnect` (bytes / (per-direction
bandwidth x achievable fraction) + latency per step of the collective, plus one kernel launch each):
- TP: an all-reduce of the layer's activations (tokens x d_model) after attention and after the MLP, one
  after the vocabulary-parallel embedding, and an all-gather of the logits. A ring all-reduce sends
  2(tp-1)/tp x the message per device in 2(tp-1) steps; small messages take recursive doubling instead
  (ceil(log2 tp) steps, the whole message each): the faster of the two is charged.
- PP: a point-to-point send of the activations (tokens x d_model) at each stage boundary.

Pipeline: the batch is split into M micro-batches (default min(batch, pp)); a decode cycle (every request
advances one token) takes max(M, pp) stage steps of a micro-batch: with fewer micro-batches than stages
the stages idle (the bubble, factor max(M, pp) / M against a full pipeline). Prefill runs the GPipe
schedule, M + pp - 1 stage steps. Host overhead (scheduling, sampling) is charged once per cycle.

Capacity is per device: every stage holds the KV of every request for its layers, every TP rank its KV
heads, so the deployment holds as many requests as the largest stage's device fits (eviction's capacity
effect is per device too). A fixed batch above what fits at its peak runs in waves of the largest batch that
does (`waves`; extra keys waves, e2e_in_waves_s, tokens_per_s_in_waves: what a static benchmark of more
requests than the KV memory holds measures; tokens_per_s stays the as-if-it-fit number). tp = pp = 1 returns
the single-device prediction itself.

The all-reduce model is checked, never fitted, against published H100 all-reduce latencies
(`python -m sim.parallel.check_allreduce`, sim/references/allreduce_h100_published.yaml).
"""
from __future__ import annotations

from .collectives import (COMM_OPS, Collective, allgather_link_bytes, allgather_time, allreduce_link_bytes,
                          allreduce_time, bubble_factor, collectives, comm_table, p2p_time)
from .predict import ParallelPrediction, micro_batches, predict, waves
from .shard import (ONCE_PER_STEP_OPS, check_degrees, kv_heads_per_rank, kv_replication, largest_stage,
                    shard_model, stage_layers)

__all__ = ["COMM_OPS", "Collective", "ONCE_PER_STEP_OPS", "ParallelPrediction", "allgather_link_bytes", "allgather_time",
           "allreduce_link_bytes", "allreduce_time", "bubble_factor", "check_degrees", "collectives", "comm_table",
           "kv_heads_per_rank", "kv_replication", "largest_stage", "micro_batches", "p2p_time", "predict",
           "shard_model", "stage_layers", "waves"]
