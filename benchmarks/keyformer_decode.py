"""Decode-step benchmark: Keyformer's slot cache at p = 0.5 against full attention with the stock cache.

GPT-2-small-shaped model (random weights, n_positions raised to 8192), a 4k-token context built without a
prefill (keyformer.generate.synthetic_state; the stock path gets an equally filled DynamicCache), batch 1
and 8. Reports the median decode step, the speedup, the roofline-ideal speedup
(weights + KV) / (weights + p * KV) with the bytes a step must read, and the share of the step spent in
the score update + selection.

    OMP_WAIT_POLICY=ACTIVE python benchmarks/keyformer_decode.py [--context 4096] [--batch 1 8] [--steps 10]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # before torch starts its OpenMP threads

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from keyformer import compat, make_policy  # noqa: E402
from kvcommon.cli import OneLineParser  # noqa: E402
from keyformer.generate import decode_one_token, synthetic_state  # noqa: E402


def gpt2_small(max_positions: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_positions=max_positions, n_embd=768, n_layer=12, n_head=12)
    model = GPT2LMHeadModel(config).eval()
    model.set_attn_implementation("eager")
    return model


def weight_bytes(model) -> int:
    """Bytes a decode step reads for weights: every parameter once (the tied embedding is read by the LM
    head; the position table contributes one row, negligible, but is counted for simplicity)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes(model, batch: int, tokens: int) -> int:
    c = model.config
    return batch * tokens * c.n_layer * 2 * c.n_embd * next(model.parameters()).element_size()


@torch.no_grad()
def time_stock(model, batch: int, context: int, steps: int, warmup: int, attn: str) -> list[float]:
    """Full attention, stock DynamicCache (torch.cat per step), transformers' own attention `attn`."""
    model.set_attn_implementation(attn)
    c = model.config
    generator = torch.Generator().manual_seed(0)
    shape = (batch, c.n_head, context, c.n_embd // c.n_head)
    cache = compat.filled_dynamic_cache([torch.randn(shape, generator=generator) for _ in range(c.n_layer)],
                                        [torch.randn(shape, generator=generator) for _ in range(c.n_layer)])
    name = compat.cache_kwarg_name(model)
    token = torch.randint(c.vocab_size, (batch, 1), generator=generator)
    times = []
    for step in range(warmup + steps):
        position = torch.full((batch, 1), context + step)
        start = time.perf_counter()
        out = model(input_ids=token, position_ids=position, use_cache=True, **{name: cache})
        elapsed = time.perf_counter() - start
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        if step >= warmup:
            times.append(elapsed)
    model.set_attn_implementation("eager")
    return times


@torch.no_grad()
def time_policy(model, name: str, batch: int, context: int, steps: int, warmup: int, **params):
    policy = make_policy(name, **params)
    with synthetic_state(model, policy, batch, context, seed=0, max_new_tokens=warmup + steps + 1) as state:
        for _ in range(warmup):
            decode_one_token(state)
        policy.profile = True
        policy.score_select_s = 0.0
        state.step_s.clear()
        for _ in range(steps):
            decode_one_token(state)
        share = policy.score_select_s / sum(state.step_s)
        held = policy.kv_lengths()[0]
    return state.step_s, share, held


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--cache-ratio", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = parser.parse_args(argv)
    if args.context < 8 or args.steps < 1 or not 0 < args.cache_ratio <= 1:
        print("error: need --context >= 8, --steps >= 1 and 0 < --cache-ratio <= 1", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    model = gpt2_small(max(8192, args.context + args.warmup + args.steps + 1))
    weights = weight_bytes(model)
    rows = []
    for batch in args.batch:
        stock_eager = statistics.median(time_stock(model, batch, args.context, args.steps, args.warmup, "eager"))
        stock_sdpa = statistics.median(time_stock(model, batch, args.context, args.steps, args.warmup, "sdpa"))
        steps, share, held = time_policy(model, "keyformer", batch, args.context, args.steps, args.warmup,
                                         cache_ratio=args.cache_ratio)
        keyformer = statistics.median(steps)
        # The same slot cache without eviction: isolates what eviction buys from the stock cache's costs
        # (torch.cat of the whole cache every step).
        full_steps, _, _ = time_policy(model, "full", batch, args.context, args.steps, args.warmup)
        full_slots = statistics.median(full_steps)
        kv_full = kv_bytes(model, batch, args.context)
        ideal = (weights + kv_full) / (weights + args.cache_ratio * kv_full)
        speedup = stock_eager / keyformer
        rows.append({
            "batch": batch, "context": args.context, "cache_ratio": args.cache_ratio, "kv_held": held,
            "stock_eager_s": stock_eager, "stock_sdpa_s": stock_sdpa, "keyformer_s": keyformer, "full_slots_s": full_slots,
            "speedup_vs_full_slots": full_slots / keyformer,
            "speedup_vs_eager": speedup, "speedup_vs_sdpa": stock_sdpa / keyformer, "ideal_speedup": ideal,
            "fraction_of_ideal": speedup / ideal, "score_select_share": share,
        })
    print(f"# GPT-2-small shape, fp32, context {args.context}, p={args.cache_ratio}, median of {args.steps} steps "
          f"after {args.warmup} warm-up; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"torch threads {torch.get_num_threads()}, torch {torch.__version__}, "
          f"transformers {compat.TRANSFORMERS_VERSION}; weights {weights / 2**20:.0f} MiB")
    header = ("batch", "kv_held", "stock_eager_ms", "stock_sdpa_ms", "full_slots_ms", "keyformer_ms",
              "speedup", "ideal", "of_ideal", "vs_full_slots", "score+select")
    print(" | ".join(f"{h:>14}" for h in header))
    for r in rows:
        cells = (r["batch"], r["kv_held"], f"{1e3 * r['stock_eager_s']:.1f}", f"{1e3 * r['stock_sdpa_s']:.1f}",
                 f"{1e3 * r['full_slots_s']:.1f}", f"{1e3 * r['keyformer_s']:.1f}", f"{r['speedup_vs_eager']:.2f}x",
                 f"{r['ideal_speedup']:.2f}x", f"{r['fraction_of_ideal']:.2f}",
                 f"{r['speedup_vs_full_slots']:.2f}x", f"{100 * r['score_select_share']:.1f}%")
        print(" | ".join(f"{c:>14}" for c in cells))
    print("# speedup = stock_eager / keyformer; ideal = (weights + KV) / (weights + p * KV), bytes read per step; "
          "vs_full_slots = the same slot cache without eviction / keyformer; score+select = share of the "
          "keyformer step in the score update and eviction")
    if args.json:
        print(json.dumps({"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                          "threads": torch.get_num_threads(), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
