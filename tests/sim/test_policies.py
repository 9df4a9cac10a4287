"""sim.policies: one object per policy, one list of names, the rules sim.kvlen and the engine read."""
import numpy as np
import pytest

from sim import kvlen, policies
from sim.models import load_model

# keyformer/ runs these too; the simulator has no honest lengths and operators for them yet
NOT_SIMULATED = {"snapkv", "tova"}


def test_names_are_keyformers_policies_the_simulator_models():
    keyformer = pytest.importorskip("keyformer")
    assert set(policies.NAMES) == set(keyformer.POLICIES) - NOT_SIMULATED
    assert list(policies.NAMES) == [n for n in keyformer.POLICIES if n not in NOT_SIMULATED]   # same order


def test_registry_and_kvlen_agree():
    assert kvlen.POLICIES == policies.NAMES
    assert kvlen.EVICTING == tuple(n for n in policies.NAMES if policies.get(n).evicts) == policies.EVICTING
    assert kvlen.SCORED == ("h2o", "keyformer") == policies.SCORED
    for name in policies.NAMES:
        assert policies.get(name).name == name
    with pytest.raises(ValueError, match="unknown policy 'snapkv'; expected one of full, window"):
        policies.get("snapkv")
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
    for name in policies.NAMES:
        p = policies.get(name)
        for stack in ("kvsim", "hf"):
            assert (p.eager_path(stack) is not None) == p.scored


def test_one_score_cost_figure_on_both_sides():
    keyformer = pytest.importorskip("keyformer")
    for name in policies.SCORED:
        assert policies.get(name).score_flops == keyformer.POLICIES[name].score_flops_per_element
    assert policies.get("keyformer").score_flops == 12 and policies.get("h2o").score_flops == 1
