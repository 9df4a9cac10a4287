"""sim.policies: one object per policy, one list of names, the rules sim.kvlen and the engine read."""
import numpy as np
import pytest

from sim import kvlen, policies
from sim.models import load_model

def test_names_are_keyformers_policies():
    keyformer = pytest.importorskip("keyformer")
    assert list(policies.NAMES) == list(keyformer.POLICIES)        # the same policies, in the same order


def test_registry_and_kvlen_agree():
    assert kvlen.POLICIES == policies.NAMES
    assert kvlen.EVICTING == tuple(n for n in policies.NAMES if policies.get(n).evicts) == policies.EVICTING
    assert kvlen.SCORED == ("h2o", "keyformer", "tova", "mass", "pyramidkv", "adakv") == policies.SCORED
    for name in policies.NAMES:
        assert policies.get(name).name == name
    with pytest.raises(ValueError, match="unknown policy 'snap'; expected one of full, window"):
        policies.get("snap")
    with pytest.raises(ValueError, match="unknown policy"):
        kvlen.check_policy("nope")


def test_policy_objects_are_frozen():
    import dataclasses
    with pytest.raises(dataclasses.FrozenInstanceError):
        policies.get("h2o").name = "x"


def test_budget_and_recent_window_are_computed_once():
    assert policies.budget(1000, 0.1) == 100.0 and policies.budget(3, 0.1) == 1.0
    assert policies.recent_window(100, 0.3) == 30.0
    np.testing.assert_array_equal(policies.budget(np.array([10, 100]), 0.5), [5.0, 50.0])


def test_lengths_by_policy():
    full, h2o = policies.get("full"), policies.get("h2o")
    assert full.kv_tokens(100, 5, 0.5) == 105 and h2o.kv_tokens(100, 5, 0.5) == 50
    assert full.peak_kv_tokens(100, 10, 0.5) == 110 and h2o.peak_kv_tokens(100, 10, 0.5) == 100
    assert h2o.peak_kv_tokens(100, 10, 0.1) == 100          # the prefill holds all n
    assert full.steady_kv_tokens(100, 10, 0.5) == 105 and h2o.steady_kv_tokens(100, 10, 0.5) == 51
    assert full.appended_tokens == 0.0 and h2o.appended_tokens == 1.0


def test_state_bytes_only_for_scored_policies():
    m = load_model("llama-2-7b")
    assert policies.get("window").state_bytes(m, 2, 100) == 0.0
    assert policies.get("keyformer").state_bytes(m, 2, 100) == 2 * 100 * m.n_layers * m.n_kv_heads * 4


def test_eager_paths_are_the_scored_policies():
    """keyformer/ (kvsim) runs a score path for every scored policy; the paper's hf code has H2O and Keyformer."""
    for name in policies.NAMES:
        p = policies.get(name)
        assert (p.eager_path("kvsim") is not None) == p.scored
        assert (p.eager_path("hf") is not None) == (name in ("h2o", "keyformer"))


def test_one_score_cost_figure_on_both_sides():
    keyformer = pytest.importorskip("keyformer")
    for name in policies.SCORED:
        assert policies.get(name).score_flops == keyformer.POLICIES[name].score_flops_per_element
    assert policies.get("keyformer").score_flops == 12 and policies.get("h2o").score_flops == 1


def test_snapkv_compresses_the_prompt_once_then_grows():
    snap = policies.get("snapkv")
    assert not snap.evicts and not snap.scored and snap.state_bytes(load_model("llama-2-7b"), 2, 100) == 0.0
    assert snap.kv_tokens(1000, 7, 0.2) == 207 and snap.kv_tokens(10, 3, 1.0) == 13
    assert snap.peak_kv_tokens(1000, 100, 0.2) == 1000          # the prefill holds all n
    assert snap.peak_kv_tokens(1000, 900, 0.2) == 1100          # then k + gen
    assert snap.steady_kv_tokens(1000, 100, 0.2) == 250


def test_snapkv_and_tova_operators():
    from sim import engine
    m = load_model("llama-3-8b")
    snap = engine.predict("h200-sxm", m, 4, 4096, 256, "snapkv", 0.25)
    window = engine.predict("h200-sxm", m, 4, 4096, 256, "window", 0.25)
    full = engine.predict("h200-sxm", m, 4, 4096, 256, "full", 1.0)
    ops = set(snap.prefill_ops.op)
    assert {"score_update", "score_pool", "select_topk", "compact"} <= ops
    assert not {"score_update", "select_evict"} & set(snap.decode_ops.op)       # nothing scored while decoding
    # grows from k: slower than a fixed window of k, faster than full attention over n + t
    assert window.tpot_s < snap.tpot_s < full.tpot_s
    # the observation window (32 queries) costs far less than scoring all 4096 prompt queries (H2O)
    h2o = engine.predict("h200-sxm", m, 4, 4096, 256, "h2o", 0.25)
    flops = lambda p: p.prefill_ops.set_index("op").loc["score_update", "flops"]
    assert flops(snap) < flops(h2o) / 50
    tova = [engine.predict("h200-sxm", m, 4, 4096, 256, "tova", 0.25, recent_ratio=r) for r in (0.0, 0.5)]
    assert tova[0].tpot_s == tova[1].tpot_s                    # no recent window: the ratio does not enter
    assert {"score_update", "select_evict"} <= set(tova[0].decode_ops.op)
    assert window.tpot_s < tova[0].tpot_s
