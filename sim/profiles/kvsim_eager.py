"""`kvsim-eager` is this project's own stack (keyformer/: slot cache on transformers 5 eager modules, run
by traces.timing on CPU): no concatenation and no reordering (a decode step scatters the newcomer into a
free slot), but the same eager attention (fp32 logits, a slot mask built per layer from the slot
positions, separate softmax), the same glue, and the policy's score path as separate eager kernels. It is
the profile the CPU validation uses: the measured points run exactly this code.
"""
from __future__ import annotations

from sim import policies
from sim.op import SCORE_BYTES, Op, OpContext
from sim.profiles.base import Profile, register_profile
from sim.profiles.eager import (EAGER_LAUNCHES, SLOT_MASK_BYTES, eager_glue, held_keys, kv_bytes, policy_eager_ops,
                                score_elems)

# The same glue in this project's stack (transformers 5.24 modules under keyformer/'s attention function),
# counted rather than read: torch.profiler on the 2- and 4-layer tiny test models (tiny-llama, tiny-gpt2;
# never on a validation shape) gives the top-level torch calls of one decode step, i.e. the ones Python
# dispatches itself (views and reshapes included, nested aten calls not). Per layer, llama: 82 (full) and
# 86 (keyformer); gpt2: 66 and 69; per step outside the layers: llama 31 / 42, gpt2 19 / 30. Subtracting
# the kernels the other operators already count (core ops 15, slot bookkeeping 4, slot mask 3 for full,
# keyformer's score and eviction path 9 + 8 per step) leaves the glue launches below. Only counts are taken
# from the profiler; the time per call is the hardware file's calibrated dispatch overhead.
KVSIM_GLUE_LAUNCHES = {"llama": 60, "mistral": 60, "qwen2": 60, "gpt2": 44}
KVSIM_STEP_LAUNCHES = {"llama": 31, "mistral": 31, "qwen2": 31, "gpt2": 19}


def kvsim_decode_ops(ctx: OpContext) -> list[Op]:
    m = ctx.model
    keys = held_keys(ctx)
    elems = score_elems(ctx)
    slot_elems = ctx.rows * m.n_kv_heads * keys
    # attend(): logits.mul_(scaling) is one more pass over the fp32 logits. A batch whose requests share one
    # budget fills every slot (keyformer/ "dense slots"): no mask. Full attention's buffer has free slots, so
    # slot_bias builds where(positions >= 0, 0, -inf) per layer and adds it to every logit.
    masked = not policies.get(ctx.policy).evicts
    ops = [
        Op("logits_scale_mask", True,
           act_bytes=2 * elems * SCORE_BYTES + masked * (slot_elems * SLOT_MASK_BYTES + 2 * elems * SCORE_BYTES),
           launches=0 + 3 * masked),   # the scale's launch is counted in attn_scores
        # cache.update also scatters the newcomer's position and zeroes its score; the full policy
        # advances free_slot (and checks growth with a host sync).
        Op("slot_bookkeeping", True, act_bytes=ctx.rows * m.n_kv_heads * 2 * 8, launches=4),
        eager_glue(ctx, KVSIM_GLUE_LAUNCHES.get(m.model_type)),
        # per step outside the layers: embedding lookup, rotary tables, mask function, cache and output
        # wrappers, logits cast and greedy argmax (top-level calls counted as above).
        Op("eager_step_glue", False, act_bytes=ctx.rows * m.d_model * ctx.ab,
           launches=KVSIM_STEP_LAUNCHES.get(m.model_type, 20)),
    ]
    ops += policy_eager_ops(ctx, "kvsim")
    return ops


def kvsim_prefill_ops(ctx: OpContext) -> list[Op]:
    m = ctx.model
    n, q = held_keys(ctx), ctx.new_tokens
    elems = score_elems(ctx)
    ops = [
        # transformers' eager causal mask (rows x 1 x q x n, fp32) built once, added in every layer.
        Op("mask_build", False, act_bytes=ctx.rows * q * n * SCORE_BYTES, launches=6),
        Op("mask_bias", True, act_bytes=2 * elems * SCORE_BYTES + ctx.rows * q * n * SCORE_BYTES, launches=1),
        # after the prompt every policy (full too) ranks the prompt and gathers the kept K/V into the slot
        # buffer (base._select_prompt + SlotLayer.compact).
        # keyformer.generate.prefill calls the model without logits_to_keep: logits for every prompt position.
        Op("lm_head_all_positions", False, flops=2 * ctx.rows * (q - 1) * m.vocab_size * m.d_model,
           act_bytes=ctx.rows * (q - 1) * m.vocab_size * SCORE_BYTES, launches=1, gemm=True,
           rows=ctx.rows * (q - 1)),
        Op("prompt_compact", True, kv_read_bytes=kv_bytes(ctx, n * ctx.cache_ratio),
           kv_write_bytes=kv_bytes(ctx, n * ctx.cache_ratio + 1),
           act_bytes=ctx.rows * m.n_kv_heads * n * (8 + 4 + 8), launches=12),
        eager_glue(ctx),
    ]
    path = policies.get(ctx.policy).eager_path("kvsim")
    if path is not None:
        passes = path["score_passes"] + path["step_passes"]     # the prompt draws its noise layer by layer
        ops.append(Op("policy_eager_passes", True, flops=passes * elems, act_bytes=passes * elems * SCORE_BYTES,
                      launches=path["score_launches"] + path["step_launches"]))
    return ops


PROFILE = KVSIM_EAGER = register_profile(Profile(
    name="kvsim-eager",
    description="this project's keyformer/ stack on PyTorch eager (slot cache: scatter writes, no concat, "
                "no reorder copies; materialised fp32 logits with a per-layer slot mask; the policy's score "
                "path as separate kernels; eager glue kernels) - what traces.timing measures "
                "(sim/profiles/kvsim_eager.py)",
    launches=EAGER_LAUNCHES,
    materialise_scores=True,
    prefill_chunk_tokens=None,
    extra_decode_ops=kvsim_decode_ops,
    extra_prefill_ops=kvsim_prefill_ops,
    eager=True,
))
