"""The eager software-stack profiles (sim/profiles/hf_eager.py, kvsim_eager.py): explicit operators with the bytes the code
moves, selectable by name everywhere a profile is (engine, sim.predict CLI)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from sim import engine
from sim.models import load_model
from sim.profiles import get_profile

MPT = load_model("mpt-7b")


def decode_table(hw, profile, policy="full", ratio=1.0, beams=4, dtype="fp16", prompt=2048, gen=2048):
    pred = engine.predict(hw, MPT, 1, prompt, gen, policy, ratio, kv_dtype=dtype, weight_dtype=dtype,
                          profile=profile, beams=beams)
    table = pred.decode_ops[pred.decode_ops["step"] == "first"].set_index("op")
    return pred, table


def test_profiles_register_through_the_registry():
    assert get_profile("hf-eager").name == "hf-eager"
    assert get_profile("kvsim-eager").materialise_scores


def test_hf_eager_cache_copies_are_explicit_operators(real_device):
    _, table = decode_table(real_device, "hf-eager")
    rows, kv_heads, head_dim, layers = 4, MPT.n_kv_heads, MPT.head_dim, MPT.n_layers
    past = 2048  # first decode step reads the prompt's KV
    per_token = 2 * rows * kv_heads * head_dim * 2 * layers           # K and V, fp16, all layers and beams
    # torch.cat: reads the cache, writes it back one token longer
    assert table.loc["cache_concat", "kv_read_bytes"] == pytest.approx(per_token * past)
    assert table.loc["cache_concat", "kv_write_bytes"] == pytest.approx(per_token * (past + 1))
    # beam search reorders (index_select) the whole cache every step
    assert table.loc["beam_reorder", "kv_read_bytes"] == pytest.approx(per_token * (past + 1))
    assert table.loc["beam_reorder", "kv_write_bytes"] == pytest.approx(per_token * (past + 1))
    # fp16 logits are upcast to fp32 for the softmax
    assert table.loc["score_upcast", "act_bytes"] > 0
    assert {"mask_bias", "mask_build", "eager_glue"} <= set(table.index)


def test_no_beam_reorder_without_beams_and_no_upcast_in_fp32(real_device):
    _, greedy = decode_table(real_device, "hf-eager", beams=1)
    assert "beam_reorder" not in greedy.index
    _, fp32 = decode_table(real_device, "hf-eager", dtype="fp32")
    assert "score_upcast" not in fp32.index


def test_keyformer_gumbel_path_and_lazy_eviction_only_for_scored_policies(real_device):
    _, full = decode_table(real_device, "hf-eager")
    _, kf = decode_table(real_device, "hf-eager", policy="keyformer", ratio=0.5)
    assert "policy_eager_passes" not in full.index and "evict_compact" not in full.index
    assert kf.loc["policy_eager_passes", "act_bytes"] > 0
    # compaction every 8 steps, amortised: one eighth of a full read + write of the kept cache
    assert kf.loc["evict_compact", "kv_read_bytes"] == pytest.approx(kf.loc["cache_concat", "kv_write_bytes"] / 8)


def test_eager_is_slower_than_fused_and_grows_faster_with_context(real_device):
    tpot = {}
    for profile in ("fused", "hf-eager"):
        for n in (1024, 4096):
            tpot[profile, n] = decode_table(real_device, profile, prompt=n, gen=n)[0].tpot_s
    assert tpot["hf-eager", 1024] > tpot["fused", 1024]
    assert tpot["hf-eager", 4096] - tpot["hf-eager", 1024] > 3 * (tpot["fused", 4096] - tpot["fused", 1024])


def test_kvsim_eager_has_no_cache_copies(real_device):
    _, table = decode_table(real_device, "kvsim-eager", policy="keyformer", ratio=0.5)
    assert not {"cache_concat", "beam_reorder", "evict_compact"} & set(table.index)
    assert {"logits_scale_mask", "slot_bookkeeping", "policy_eager_passes"} <= set(table.index)


def test_decode_step_time_vectorises_over_beams(real_device):
    one = engine.decode_step_time(real_device, MPT, np.full(1, 1000.0), profile="hf-eager", beams=1)
    four = engine.decode_step_time(real_device, MPT, np.full(1, 1000.0), profile="hf-eager", beams=4)
    assert four > one


def test_sim_predict_cli_accepts_hf_eager(real_device):
    out = subprocess.run([sys.executable, "-m", "sim.predict", "--hw", "a100-80g-sxm", "--model", "mpt-7b",
                          "--prompt", "512", "--gen", "64", "--beams", "4", "--profile", "hf-eager", "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["profile"] == "hf-eager"
