"""`fused` (also `ideal`): ideal kernels, one pass over the weights and the kept KV per step: the bound a real
stack approaches, not a prediction of one (the default is `auto`: sim/profiles/__init__.py)."""
from __future__ import annotations

import dataclasses

from sim.profiles.base import Profile, register_profile

PROFILE = register_profile(Profile(
    name="fused",
    description="ideal fused kernels (vLLM/TensorRT-LLM class): one flash-attention kernel per layer "
                "(scores, softmax and attn x V on chip; in decode it also accumulates the H2O/Keyformer scores), "
                "one selection kernel per layer, fused gate+up MLP, logits for the last token only, "
                "prefill activations bounded by 8192-token chunks",
    launches={"embed": 1, "norms": 2, "qkv_proj": 1, "kv_write": 1, "attn_scores": 1, "softmax": 0, "attn_v": 0,
              "out_proj": 1, "mlp": 2, "final_norm": 1, "lm_head": 1, "score_update": 1, "select_evict": 1,
              "select_topk": 1, "compact": 1},
    score_in_attention=True,
))

# the same kernels under the name that says what they are: the ideal-kernel bound
IDEAL = register_profile(dataclasses.replace(PROFILE, name="ideal", description="the ideal-kernel bound (= fused): "
                                             + PROFILE.description))
