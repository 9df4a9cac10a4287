"""vLLM-like continuous-batching scheduler: admission on KV memory, preemption by recompute, chunked prefill.

Pure bookkeeping, no simpy and no timing model: `plan_step(now)` decides what the accelerator runs next
(a `StepPlan`), the caller times it, and `finish_step(plan, now)` applies its effects (tokens emitted,
memory freed, requests finished). Per-request state lives in numpy arrays indexed by request id so
that a decode step costs a handful of vectorised operations whatever the batch size.

Token accounting (as in vLLM): the prefill of a request's n prompt tokens emits its first output token;
each later token comes from one decode step, so a request with G output tokens runs 1 prefill + G-1
decode steps. Decode step t (t = 0 is the first after prefill) produces token t+2; it reads `kv[t]`
cached tokens per KV head (sim.kvlen.kv_tokens, or a captured trace) and appends its own token, so it
holds kv[t] + 1 tokens while it runs (an evicting policy then drops one to return to its budget).

Memory (`admission='paged'`, the default, vLLM's on-demand PagedAttention allocation):
- a request holds the blocks of the tokens it has materialised; a prefill materialises every token it
  computes (eviction policies too: they score the whole prompt, then evict; a sliding-window layer keeps
  at most its window, as vLLM allocates it), a decode step needs the
  blocks of kv[t] + 1; after a step a request keeps min(held, blocks(next step's need)), so an evicting
  policy drops to its budget after prefill and full attention grows a block every `block_tokens` steps;
- new requests are admitted FCFS while their prefill fits in the free blocks minus a watermark
  (vLLM's 1 %), so that running requests can still grow;
- when running requests cannot grow, the most recently admitted request is preempted: its blocks are
  freed and it returns to the head of the queue; on readmission it recomputes prompt + generated tokens
  in one prefill (vLLM's recompute preemption), which emits its next token.
`admission='reserve'` instead reserves each request's peak need (max over prefill and all decode steps;
a sliding-window layer holds at most its window) at admission and keeps it until completion: no preemption
can occur, at the price of fewer concurrent requests for full attention (the analytic all-at-once batch).

A request that cannot fit in an empty KV pool is dropped (reported, never silently lost).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from .arrivals import Workload
from .columns import RunLengths
from .kvmemory import BlockPool, kv_schedule_table, prefill_held
from .step_plan import ADMISSION_MODES, DEFAULT_WATERMARK, KVLengths, SchedulerConfig, StepPlan

__all__ = ["ADMISSION_MODES", "DEFAULT_WATERMARK", "KVLengths", "Scheduler", "SchedulerConfig", "StepPlan"]

# request status codes
WAITING, PREFILL, DECODE, DONE, DROPPED, NOT_ARRIVED = range(6)


class Scheduler:
    def __init__(self, workload: Workload, kv: KVLengths, config: SchedulerConfig):
        self.cfg = config
        self.pool = BlockPool(config.capacity_blocks, config.block_tokens, config.block_bytes)
        n = len(workload)
        self.n_requests = n
        self.prompt = workload.prompt_tokens.astype(np.int64)
        self.output = workload.output_tokens.astype(np.int64)
        self.arrival = workload.arrival_s.astype(float)
        self._build_kv_table(kv)

        self.status = np.full(n, NOT_ARRIVED, dtype=np.int8)
        self.generated = np.zeros(n, dtype=np.int64)       # output tokens emitted so far
        self.prefill_total = np.zeros(n, dtype=np.int64)   # tokens the current (re)prefill computes
        self.prefill_done = np.zeros(n, dtype=np.int64)    # of which already computed (chunked prefill)
        self.held = np.zeros(n, dtype=np.int64)            # KV blocks held
        self.admit_seq = np.zeros(n, dtype=np.int64)       # order of the latest admission (preemption victim = max)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.first_scheduled = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.last_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        # the next decode step of each decoding request: tokens it reads and blocks it needs, set whenever
        # the request emits a token (finish_step), so a step reads them instead of recomputing them
        self.next_kv = np.zeros(n)
        self.next_need = np.zeros(n, dtype=np.int64)
        self.drop_reason: dict[int, str] = {}

        self.waiting: deque[int] = deque()
        self.prefilling: list[int] = []                    # admitted, prefill not complete (admission order)
        self.running = np.zeros(0, dtype=np.int64)         # decoding, admission order
        self._seq = 0
        self.itl = RunLengths()                            # inter-token gaps, pooled over requests (as runs)
        self.completed = 0
        self.dropped = 0
        self.total_preemptions = 0

    # ---- setup -------------------------------------------------------------------------------------
    # ---- setup -------------------------------------------------------------------------------------
    def _build_kv_table(self, kv: KVLengths) -> None:
        self.kv_flat, self.kv_offset, self.peak_blocks = kv_schedule_table(kv, self.prompt, self.output, self.pool)
        self._prefill_held = prefill_held(kv)
        reserve = self.cfg.admission == "reserve"
        # reservations already cover all growth; else vLLM's watermark of free blocks
        self._watermark = 0 if reserve else int(np.ceil(self.cfg.watermark * self.pool.capacity_blocks))

    # ---- queue -------------------------------------------------------------------------------------
    def arrive(self, i: int, now: float) -> None:
        if self.peak_blocks[i] > self.pool.capacity_blocks:
            bt = self.pool.block_tokens
            self._drop(i, f"needs {self.peak_blocks[i] * bt} tokens of KV memory, the device holds "
                          f"{self.pool.capacity_blocks * bt}")
            return
        self.status[i] = WAITING
        self.waiting.append(i)

    def _drop(self, i: int, reason: str) -> None:
        self.status[i] = DROPPED
        self.drop_reason[i] = reason
        self.dropped += 1

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or len(self.running))

    def in_flight(self) -> int:
        return len(self.prefilling) + len(self.running)

    # ---- memory helpers ----------------------------------------------------------------------------
    def _kv_next(self, ids: np.ndarray) -> np.ndarray:
        """Cached tokens read by the next decode step of each id (decode step index = generated - 1)."""
        return self.kv_flat[self.kv_offset[ids] + self.generated[ids] - 1]

    def _admission_blocks(self, i: int, tokens: int) -> int:
        if self.cfg.admission == "reserve":
            return int(self.peak_blocks[i])
        return self.pool.blocks_for_one(self._prefill_held(tokens))

    def _watermark_blocks(self) -> int:
        return self._watermark

    def _preempt(self, i: int) -> None:
        """Recompute preemption: free everything, back to the head of the queue with its tokens so far."""
        self.pool.release(int(self.held[i]))
        self.held[i] = 0
        if self.status[i] == PREFILL:
            self.prefilling.remove(i)
        else:
            self.running = self.running[self.running != i]
        self.status[i] = WAITING
        self.prefill_done[i] = 0
        self.preemptions[i] += 1
        self.total_preemptions += 1
        self.waiting.appendleft(i)

    def _victim(self) -> int:
        candidates = np.concatenate([self.running, np.asarray(self.prefilling, dtype=np.int64)])
        return int(candidates[np.argmax(self.admit_seq[candidates])])

    def _grow_decodes(self, dec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Give each decode request the blocks its next step needs, preempting (LIFO) until they fit."""
        while True:
            kv = self.next_kv[dec]
            need = self.next_need[dec]
            extra = np.maximum(need - self.held[dec], 0)
            total_extra = int(extra.sum())
            if total_extra <= self.pool.free_blocks:
                break
            victim = self._victim()
            self._preempt(victim)
            dec = dec[dec != victim]
        if total_extra:
            self.pool.allocate(total_extra)
            self.held[dec] += extra
        return dec, kv

    # ---- planning ----------------------------------------------------------------------------------
    def _batch_room(self) -> int:
        if self.cfg.max_batch is None:
            return 1 << 62
        return self.cfg.max_batch - self.in_flight()

    def _admit_head(self, budget: int, chunked: bool, step_cap: int = 1 << 62,
                    first: bool = True) -> tuple[int, int] | None:
        """Admit the head of the queue if its (first chunk of) prefill fits; return (id, chunk) or None.
        Without chunking a whole prefill must fit in `step_cap` tokens unless it is the step's `first`."""
        if not self.waiting or self._batch_room() <= 0 or budget <= 0:
            return None
        i = self.waiting[0]
        total = int(self.prompt[i] + self.generated[i])  # recompute covers the tokens already generated
        whole = self._admission_blocks(i, total)
        if whole > self.pool.capacity_blocks:
            # Only a recompute can get here (arrival checked the first prefill): an evicting policy
            # re-materialises prompt + generated tokens, which may exceed the whole pool.
            self.waiting.popleft()
            self._drop(i, "recompute after preemption needs more KV memory than the device has")
            return self._admit_head(budget, chunked, step_cap, first)
        chunk = min(total, budget) if chunked else total
        if not chunked and not first and chunk > step_cap:
            return None
        blocks = whole if chunk == total else self._admission_blocks(i, chunk)
        # The watermark keeps room for running requests to grow; with none running it protects nothing.
        watermark = self._watermark_blocks() if self.in_flight() else 0
        if blocks + watermark > self.pool.free_blocks:
            return None
        self.waiting.popleft()
        self.pool.allocate(blocks)
        self.held[i] = blocks
        self.status[i] = PREFILL
        self.prefill_total[i] = total
        self.prefill_done[i] = 0
        self._seq += 1
        self.admit_seq[i] = self._seq
        self.prefilling.append(i)
        return i, chunk

    def _continue_prefills(self, budget: int, decodes: np.ndarray
                           ) -> tuple[list[tuple[int, int, int, bool]], np.ndarray, int]:
        """Next chunk of each partial prefill (oldest first); preempts newer requests when memory is short
        (a prefill that only waited could deadlock with other partial prefills holding the memory)."""
        chunks = []
        for i in list(self.prefilling):
            if budget <= 0:
                break
            if self.status[i] != PREFILL:
                continue  # preempted earlier in this loop
            past = int(self.prefill_done[i])
            new = min(int(self.prefill_total[i]) - past, budget)
            extra = max(self._admission_blocks(i, past + new) - int(self.held[i]), 0)
            while extra > self.pool.free_blocks:
                victim = self._victim()
                self._preempt(victim)
                decodes = decodes[decodes != victim]
                if victim == i:
                    break
            if self.status[i] != PREFILL:
                continue
            self.pool.allocate(extra)
            self.held[i] += extra
            chunks.append((i, new, past, past + new == int(self.prefill_total[i])))
            budget -= new
        return chunks, decodes, budget

    def plan_step(self, now: float) -> StepPlan | None:
        """The next forward pass, or None when nothing can run (idle until an arrival)."""
        empty = np.zeros(0, dtype=np.int64)
        if self.cfg.chunked_prefill is None:
            # vLLM v0 without chunking: a step is either all-prefill (admitted FCFS) or all-decode.
            prefills, tokens = [], 0
            cap = self.cfg.max_step_tokens or (1 << 62)
            while (admitted := self._admit_head(1 << 62, chunked=False, step_cap=cap - tokens,
                                                first=not prefills)) is not None:
                i, chunk = admitted
                prefills.append((i, chunk, 0, True))
                tokens += chunk
            if prefills:
                self._mark_scheduled([chunk[0] for chunk in prefills], now)
                return StepPlan(empty, np.zeros(0), prefills)
            if not len(self.running):
                return None
            dec, kv = self._grow_decodes(self.running)
            return StepPlan(dec, kv) if len(dec) else self.plan_step(now)

        # Chunked prefill (vLLM v1 / Sarathi): decodes first, then running prefills, then new requests,
        # all within one token budget per step.
        budget = self.cfg.chunked_prefill
        preempted_before = self.total_preemptions
        dec, _ = self._grow_decodes(self.running[:budget])
        budget -= len(dec)
        chunks, dec, budget = self._continue_prefills(budget, dec)
        kv = self.next_kv[dec]
        new = []
        # Like vLLM v1: no new admissions in a step that had to preempt (they would be preempted next).
        while (self.total_preemptions == preempted_before
               and (admitted := self._admit_head(budget, chunked=True)) is not None):
            i, chunk = admitted
            chunks.append((i, chunk, 0, chunk == int(self.prefill_total[i])))
            new.append(i)
            budget -= chunk
        self._mark_scheduled(new, now)
        if not len(dec) and not chunks:
            return None
        return StepPlan(dec, kv, chunks)

    def _mark_scheduled(self, ids, now: float) -> None:
        for i in ids:
            if np.isnan(self.first_scheduled[i]):
                self.first_scheduled[i] = now

    # ---- effects of a finished step ----------------------------------------------------------------
    def finish_step(self, plan: StepPlan, now: float) -> int:
        """Apply the step's effects at time `now`; return how many requests completed."""
        completed = 0
        dec = plan.decode_ids
        if len(dec):
            self.itl.extend(now - self.last_token[dec])
            self.last_token[dec] = now
            self.generated[dec] += 1
            done = self.generated[dec] >= self.output[dec]
            if done.any():
                finished = dec[done]
                self._complete(finished, now)
                completed += len(finished)
                self.running = self.running[self.status[self.running] == DECODE]
                dec = dec[~done]
            self._next_step(dec)
        started = []
        for i, new, _past, _completes in plan.prefill:
            self.prefill_done[i] += new
            if self.prefill_done[i] < self.prefill_total[i]:
                continue
            self.prefilling.remove(i)
            if self.generated[i] == 0:
                self.first_token[i] = now
            else:  # recompute after preemption: the gap includes the stall
                self.itl.append(now - self.last_token[i])
            self.last_token[i] = now
            self.generated[i] += 1
            if self.generated[i] >= self.output[i]:
                self._complete(np.array([i]), now)
                completed += 1
                continue
            self.status[i] = DECODE
            started.append(i)
        if started:
            started = np.asarray(started, dtype=np.int64)
            self.running = np.concatenate([self.running, started])
            self._next_step(started)
        return completed

    def _next_step(self, ids: np.ndarray) -> None:
        """Record what the next decode step of `ids` reads and needs; with paged memory release the blocks
        beyond that need (evicting policies fall to their budget)."""
        if not len(ids):
            return
        kv = self._kv_next(ids)
        need = self.pool.blocks_for(kv + 1.0)  # the step appends its own token
        self.next_kv[ids] = kv
        self.next_need[ids] = need
        if self.cfg.admission == "paged":
            held = self.held[ids]
            keep = np.minimum(held, need)
            freed = int((held - keep).sum())
            if freed:
                self.held[ids] = keep
                self.pool.release(freed)

    def _complete(self, ids: np.ndarray, now: float) -> None:
        self.finish[ids] = now
        self.status[ids] = DONE
        self.pool.release(int(self.held[ids].sum()))
        self.held[ids] = 0
        self.completed += len(ids)

    # ---- invariants (used by tests and checked at the end of every simulation) ----------------------
    def check_invariants(self) -> None:
        """Raise AssertionError (also under python -O) if the bookkeeping is inconsistent."""
        used, cap = self.pool.used_blocks, self.pool.capacity_blocks
        if not 0 <= used <= cap:
            raise AssertionError(f"KV pool holds {used} of {cap} blocks")
        if used != int(self.held.sum()):
            raise AssertionError(f"requests hold {int(self.held.sum())} blocks, the pool counts {used}")
        if self.cfg.max_batch is not None and self.in_flight() > self.cfg.max_batch:
            raise AssertionError(f"{self.in_flight()} requests in flight, max_batch {self.cfg.max_batch}")
