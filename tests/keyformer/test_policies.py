"""Policies x architectures (tiny random models): exactness, budgets, eviction, equivalences."""
from __future__ import annotations

import pytest
import torch

from keyformer import compat, make_policy
from keyformer.generate import decode_n_tokens, decode_one_token, prefill, synthetic_state
from tests.keyformer.reference import masked_reference_logits, stock_logits
from tests.keyformer.tiny_models import VOCAB, build

PROMPT_LEN = 24
STEPS = 6
TOL = 1e-5
GROWING = ("full", "snapkv")  # no eviction while decoding: the cache grows by one token a step
ADAPTIVE = ("mass", "pyramidkv", "adakv")  # lengths vary per layer, head and step (tests/keyformer/test_adaptive.py)


def prompt(length=PROMPT_LEN, seed=0, batch=1):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def policy_for(name, **params):
    if name == "keyformer":
        params.setdefault("max_new_tokens", STEPS + 1)
    return make_policy(name, **params)


def ratio_params(name, cache_ratio):
    return {} if name == "full" else {"cache_ratio": cache_ratio}


def kv_group(model):
    config = model.config
    return config.num_attention_heads // (getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def test_full_budget_gives_the_stock_logits(case):
    """p = 1: the prompt and the first decode step see every token, so logits equal the unmodified model's;
    the full policy keeps equalling it at every step."""
    name, arch, model = case
    ids = prompt()
    policy = policy_for(name, **ratio_params(name, 1.0))
    with prefill(model, policy, ids) as state:
        ours = [state.logits.clone()]
        for _ in range(STEPS):
            ours.append(decode_one_token(state).clone())
        fed = state.generated[:-1]
    reference = stock_logits(model, ids, fed)
    compared = len(ours) if name == "full" else 2  # after that, a fixed k = n must evict
    if name == "mass":
        compared = 1  # keeps a share of the score even at k = n
    for step in range(compared):
        assert torch.allclose(ours[step], reference[step], atol=TOL, rtol=0), (step, (ours[step] - reference[step]).abs().max())


def test_budget_window_sinks_and_in_place_slots(case):
    """Every layer and KV head holds exactly k tokens after the prompt and after every decode step, in a
    k + 1 slot buffer that decode steps reuse in place; the recent window and the sinks are never evicted."""
    name, arch, model = case
    ids = prompt()
    if name in ADAPTIVE:
        from tests.keyformer.test_adaptive import check_adaptive_lengths
        return check_adaptive_lengths(name, model, ids, STEPS)
    policy = policy_for(name, **ratio_params(name, 0.5))
    events = []
    policy.add_observer(events.append)
    with prefill(model, policy, ids) as state:
        k, w = int(policy.budget[0]), int(policy.recent[0])
        expected_k = PROMPT_LEN if name == "full" else PROMPT_LEN // 2
        assert k == expected_k
        windows = [layer.window for layer in policy.layers]  # sliding-window layers: a window - 1 + 1 buffer
        buffers = [layer.keys.data_ptr() for layer in policy.layers]
        for layer in policy.layers:
            assert layer.keys.shape[-2] == (k + 1 if layer.window is None else layer.window)  # prompt K/V released
        for step in range(STEPS):
            decode_one_token(state)
            kept_buffers = [layer.keys.data_ptr() for layer in policy.layers]
            if name not in GROWING:
                assert kept_buffers == buffers  # no copy of the cache
            else:
                assert [b for b, w in zip(kept_buffers, windows) if w] == [b for b, w in zip(buffers, windows) if w]
    n_layers = len(policy.layers)
    assert len(events) == n_layers * (STEPS + 1)
    assert [e.step for e in events[::n_layers]] == list(range(-1, STEPS))
    for event in events:
        held = event.kept_positions
        newest = PROMPT_LEN - 1 + (event.step + 1)
        window = windows[event.layer]
        if window is not None:  # the window - 1 newest tokens, whatever the policy
            assert event.kv_len == window - 1
            assert held.shape[-1] == window - 1
            assert (held == torch.arange(newest - window + 2, newest + 1)).all()
            continue
        expected = k + event.step + 1 if name in GROWING else k
        assert event.kv_len == expected
        assert held.shape[-1] == expected and bool((held >= 0).all())
        for head in held[0]:
            kept = set(head.tolist())
            assert len(kept) == expected
            assert set(range(newest - w + 1, newest + 1)) <= kept  # recent window
            if name == "snapkv":  # the observation window, then every generated token
                assert set(range(PROMPT_LEN - w, newest + 1)) <= kept
            if name == "streaming":
                assert {0, 1, 2, 3} <= kept
            if name == "window":
                assert kept == set(range(newest - k + 1, newest + 1))
    assert policy.kv_lengths() == [expected if w is None else w - 1 for w in windows]


def test_physical_eviction_equals_masking_reference(case):
    """Decode logits with evicted tokens physically gone equal the full cache with those keys masked
    (original positions; for MPT the ALiBi bias is gathered at the kept tokens' original positions)."""
    name, arch, model = case
    ids = prompt()
    policy = policy_for(name, **ratio_params(name, 0.5))
    kept = {}
    policy.add_observer(lambda e: kept.__setitem__((e.step, e.layer), e.kept_positions.clone()))
    with prefill(model, policy, ids) as state:
        ours = [decode_one_token(state).clone() for _ in range(STEPS)]
        fed = state.generated[:STEPS]
    reference = masked_reference_logits(model, ids, fed, kept, kv_group(model))
    for step, (a, b) in enumerate(zip(ours, reference)):
        assert torch.allclose(a, b, atol=TOL, rtol=0), (step, (a - b).abs().max())


def test_generate_matches_manual_loop(case):
    name, arch, model = case
    ids = prompt(seed=1)
    manual = policy_for(name, **ratio_params(name, 0.5))
    with prefill(model, manual, ids) as state:
        decode_n_tokens(state, STEPS)
        manual_kept = [manual.kept_positions(i) for i in range(len(manual.layers))]
    params = ratio_params(name, 0.5)
    through_generate = make_policy(name, **params)  # keyformer: T comes from generate's max_new_tokens
    with through_generate.apply(model):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=STEPS + 1, do_sample=False)
    assert out[:, PROMPT_LEN:].tolist() == state.tokens.tolist()
    for layer, kept in enumerate(manual_kept):
        assert torch.equal(through_generate.kept_positions(layer), kept)
    assert model.config._attn_implementation in ("eager", None) or arch == "mpt"


def test_left_padded_batch_equals_each_sequence_alone(case):
    """Per-sequence budgets from the real lengths, padding never kept, selection per sequence. Keyformer's
    noise too: each row draws from its sample's own stream over its own extent, so a sample given the same
    index draws the same noise in a batch as alone."""
    name, arch, model = case
    params = ratio_params(name, 0.5)
    lengths = (PROMPT_LEN, PROMPT_LEN - 7)
    singles = [prompt(n, seed=10 + i) for i, n in enumerate(lengths)]
    batch = torch.zeros(2, PROMPT_LEN, dtype=torch.long)
    mask = torch.zeros(2, PROMPT_LEN, dtype=torch.long)
    for row, ids in enumerate(singles):
        batch[row, PROMPT_LEN - ids.shape[1]:] = ids[0]
        mask[row, PROMPT_LEN - ids.shape[1]:] = 1
    batched = policy_for(name, **params)
    if name == "keyformer":
        batched.sample_indices = [0, 1]
    with prefill(model, batched, batch, mask) as state:
        decode_n_tokens(state, STEPS)
        batch_tokens, batch_logits = state.tokens, state.logits
        batch_kept = [batched.kept_positions(i) for i in range(len(batched.layers))]
    for row, ids in enumerate(singles):
        alone = policy_for(name, **params)
        if name == "keyformer":
            alone.sample_indices = [row]
        with prefill(model, alone, ids) as single:
            decode_n_tokens(single, STEPS)
            assert single.tokens[0].tolist() == batch_tokens[row].tolist()
            assert torch.allclose(single.logits[0], batch_logits[row], atol=1e-4, rtol=0)
            for layer in range(len(alone.layers)):
                mine = batch_kept[layer][row]
                expected = alone.kept_positions(layer)[0]
                assert torch.equal(mine[:, :expected.shape[-1]], expected)
                assert bool((mine[:, expected.shape[-1]:] == -1).all())  # padding never kept


def _kept_trace(model, policy, ids, steps):
    trace = []
    policy.add_observer(lambda e: trace.append(e.kept_positions.clone()))
    with prefill(model, policy, ids) as state:
        decode_n_tokens(state, steps)
    return trace, state.tokens


def test_keyformer_noise_is_seeded_and_none_at_unit_temperature_is_h2o(arch_model):
    arch, model = arch_model
    ids = prompt(seed=2)
    first, _ = _kept_trace(model, make_policy("keyformer", seed=7, max_new_tokens=STEPS + 1), ids, STEPS)
    again, _ = _kept_trace(model, make_policy("keyformer", seed=7, max_new_tokens=STEPS + 1), ids, STEPS)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    plain, plain_tokens = _kept_trace(
        model, make_policy("keyformer", noise="none", tau_init=1.0, tau_end=1.0, recent_ratio=0.3), ids, STEPS)
    h2o, h2o_tokens = _kept_trace(model, make_policy("h2o", recent_ratio=0.3), ids, STEPS)
    assert len(plain) == len(h2o) and all(torch.equal(a, b) for a, b in zip(plain, h2o))
    assert torch.equal(plain_tokens, h2o_tokens)
    if arch != "mistral":  # (every Mistral layer keeps its window: there is no choice to change)
        assert any(not torch.equal(a, b) for a, b in zip(first, plain))  # the Gumbel noise does change choices


def test_zero_recent_ratio_means_pure_key_tokens():
    """r = 0 still evicts down to k (the official code's r = 0 disabled eviction)."""
    model = build("llama_gqa")
    policy = make_policy("h2o", cache_ratio=0.25, recent_ratio=0.0)
    with prefill(model, policy, prompt()) as state:
        decode_n_tokens(state, 3)
        assert int(policy.recent[0]) == 0
        assert policy.kv_lengths() == [PROMPT_LEN // 4] * 2


def test_keyformer_temperature_schedule_is_linear():
    policy = make_policy("keyformer", tau_init=1.0, tau_end=2.0, max_new_tokens=10)
    assert [policy.temperature(t) for t in (0, 5, 10)] == [1.0, 1.5, 2.0]
    with pytest.raises(ValueError, match="max_new_tokens"):
        make_policy("keyformer").temperature(3)


def test_beam_search_reorders_slots_and_scores():
    model = build("llama_gqa")
    policy = make_policy("keyformer", cache_ratio=0.5, max_new_tokens=4)
    ids = torch.cat([prompt(seed=3), prompt(seed=4)])
    with prefill(model, policy, ids) as state:
        layer = policy.layers[1]
        before = {n: getattr(layer, n).clone() for n in ("keys", "positions", "scores")}
        state.cache.reorder_cache(torch.tensor([1, 0]))
        for n, tensor in before.items():
            assert torch.equal(getattr(layer, n), tensor.flip(0))
    beams = make_policy("keyformer", cache_ratio=0.5)
    with beams.apply(model):
        out = model.generate(prompt(seed=3), max_new_tokens=5, num_beams=3, do_sample=False)
    assert out.shape == (1, PROMPT_LEN + 5)
    assert beams.kv_lengths() == [PROMPT_LEN // 2] * 2


def test_scores_aggregate_over_the_query_heads_of_a_kv_group():
    model = build("llama_gqa")  # 4 query heads, 2 KV heads
    policy = make_policy("h2o", cache_ratio=0.5)
    with prefill(model, policy, prompt()):
        scores = policy.layers[0].scores
        assert scores.shape[1] == 2
        # column sums of two heads' causal softmax over 24 queries: each head contributes 24 in total
        kept_total = scores[0, :, :PROMPT_LEN // 2].sum(-1)
        assert bool((kept_total <= 2 * PROMPT_LEN + 1e-3).all()) and bool((kept_total > PROMPT_LEN).all())
        assert policy.score_work.elements == 2 * 4 * PROMPT_LEN * PROMPT_LEN  # layers x q heads x n x n


def test_synthetic_state_decodes_at_budget():
    model = build("gpt2")
    policy = make_policy("keyformer", cache_ratio=0.5)
    with synthetic_state(model, policy, batch=2, context_len=200, seed=1) as state:
        assert policy.kv_lengths() == [100, 100]
        held = policy.kept_positions(0)
        assert held.shape == (2, 4, 100) and int(held.max()) == 199
        decode_one_token(state)
        decode_one_token(state)
        assert policy.kv_lengths() == [100, 100]
        assert int(policy.kept_positions(1).max()) == 201
        assert policy.score_work.by_step[1]["elements"] == 2 * 2 * 4 * 101
    again = make_policy("keyformer", cache_ratio=0.5)
    with synthetic_state(model, again, batch=2, context_len=200, seed=1):
        assert torch.equal(again.kept_positions(0), held)


def test_renumbered_positions_feed_the_compressed_length():
    model = build("gpt2")
    seen = []
    handle = model.transformer.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw.get("position_ids")), with_kwargs=True)
    try:
        for mode in ("original", "renumber"):
            policy = make_policy("h2o", cache_ratio=0.5, position_mode=mode)
            with prefill(model, policy, prompt()) as state:
                decode_one_token(state)
    finally:
        handle.remove()
    assert seen[1].tolist() == [[PROMPT_LEN]] and seen[3].tolist() == [[PROMPT_LEN // 2]]


def test_unsupported_configurations_are_refused():
    from keyformer.attention import layer_windows
    from keyformer.tiny import random_model, tiny_config
    # Sliding-window layers are supported (tiny "gemma3" and "mistral" in the matrix); Gemma 2's attention
    # logit soft-capping and chunked-attention layers are not.
    gemma2 = random_model(tiny_config("gemma3", VOCAB, 64) | {"model_type": "gemma2", "layer_types": None})
    assert gemma2.config.attn_logit_softcapping is not None
    with pytest.raises(ValueError, match="soft-capping"):
        with make_policy("h2o").apply(gemma2):
            pass
    chunked = type("Config", (), {"model_type": "llama4", "sliding_window": None,
                                  "layer_types": ["chunked_attention", "full_attention"]})
    with pytest.raises(ValueError, match="chunked_attention"):
        layer_windows(chunked, 2)
    assert layer_windows(build("gemma3").config, 3) == [8, 8, None]
    assert layer_windows(build("mistral").config, 2) == [8, 8]
    assert layer_windows(build("llama_gqa").config, 2) == [None, None]
    model = build("llama_gqa")
    from transformers.cache_utils import StaticCache
    with pytest.raises(ValueError, match="StaticCache is not supported"):
        with make_policy("h2o").apply(model):
            model(input_ids=prompt(), use_cache=True, **{compat.cache_kwarg_name(model): StaticCache(
                config=model.config, max_cache_len=64)})
    model.generation_config.cache_implementation = "static"
    with pytest.raises(ValueError, match="static"):
        with make_policy("h2o").apply(model):
            pass
    assert model.config._attn_implementation == "eager"  # restored after the refusal


def test_make_policy_validates():
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("quest")
    with pytest.raises(ValueError, match="no parameter"):
        make_policy("h2o", noise="gumbel")
    with pytest.raises(ValueError, match="cache_ratio"):
        make_policy("keyformer", cache_ratio=1.5)
    with pytest.raises(ValueError, match="noise"):
        make_policy("keyformer", noise="uniform")


@pytest.mark.parametrize("noise", ["gumbel", "gaussian", "constant"])
def test_noise_has_the_ablation_moments(noise):
    """Gumbel(0, 1) and its moment-matched stand-ins (paper Table 4): mean 0.5772, std 1.2825 (0 for constant)."""
    policy = make_policy("keyformer", noise=noise)
    zeta = policy._draw((400_000,), torch.zeros(1), tau=1.0, generator=torch.Generator().manual_seed(0))
    assert abs(zeta.mean().item() - 0.5772) < 0.01
    assert abs(zeta.std().item() - (0.0 if noise == "constant" else 1.2825)) < 0.01
    if noise == "gumbel":  # the Gumbel tail: P(zeta > 3) = 1 - exp(-exp(-3)) = 0.0486
        assert abs((zeta > 3).float().mean().item() - 0.0486) < 0.002


@pytest.mark.parametrize("arch", ["llama_gqa", "gptj"])
def test_renumbered_positions_are_refused_on_rope_models(arch):
    model = build(arch)
    with pytest.raises(ValueError, match="RoPE"):
        with make_policy("streaming", cache_ratio=0.5, position_mode="renumber").apply(model):
            pass
    with make_policy("full", position_mode="renumber").apply(model):  # nothing evicted: nothing moves
        pass


def test_beams_of_one_input_share_the_prompt_noise():
    """transformers expands an input to its beams before the prompt's forward: with independent noise per
    row the identical beams would start from different key sets; they must start from the same one."""
    model = build("llama_gqa")
    policy = make_policy("keyformer", cache_ratio=0.4, seed=3)
    at_prompt = {}
    policy.add_observer(lambda e: at_prompt.setdefault(e.layer, e.kept_positions.clone()) if e.step == -1 else None)
    with policy.apply(model):
        model.generate(prompt(length=40, seed=9), max_new_tokens=4, num_beams=4, do_sample=False)
    for kept in at_prompt.values():
        assert kept.shape[0] == 4 and all(torch.equal(kept[0], kept[b]) for b in range(1, 4))
    # different inputs in one batch still draw their own noise (selection stays per sequence)
    two = make_policy("keyformer", cache_ratio=0.4, seed=3, max_new_tokens=4)
    ids = torch.cat([prompt(length=40, seed=9), prompt(length=40, seed=9), prompt(length=40, seed=10)])
    with prefill(model, two, ids):
        kept = two.kept_positions(0)
        assert torch.equal(kept[0], kept[1])
        assert two.prompt_groups.tolist() == [0, 0, 2]


def test_replayed_prefill_equals_the_forward(case):
    """prefill(..., record=) starts a policy from a recorded full-attention prompt forward: same kept tokens,
    same scores and the same greedy continuation as running the prompt under the policy."""
    from keyformer.generate import record_prefill

    name, arch, model = case
    ids = prompt(seed=11)
    record = record_prefill(model, ids)
    runs = []
    for rec in (None, record):
        policy = policy_for(name, **ratio_params(name, 0.5))
        with prefill(model, policy, ids, record=rec) as state:
            decode_n_tokens(state, STEPS)
            runs.append(([policy.kept_positions(i).clone() for i in range(len(policy.layers))],
                         [layer.scores.clone() for layer in policy.layers], state.tokens.clone()))
    (kept_a, scores_a, tokens_a), (kept_b, scores_b, tokens_b) = runs
    assert torch.equal(tokens_a, tokens_b)
    assert all(torch.equal(a, b) for a, b in zip(kept_a, kept_b))
    assert all(torch.allclose(a, b) for a, b in zip(scores_a, scores_b))
    with pytest.raises(ValueError, match="another input"):
        prefill(model, policy_for(name, **ratio_params(name, 0.5)), prompt(seed=12), record=record)
    # A second budget of the same policy reuses the recorded prompt scores (and the generator state after
    # them): still the same as running its prompt forward.
    if name != "full":
        outcomes = []
        for rec in (None, record):
            policy = policy_for(name, cache_ratio=0.3)
            with prefill(model, policy, ids, record=rec) as state:
                decode_n_tokens(state, STEPS)
                outcomes.append((state.tokens.clone(), policy.kept_positions(0).clone(), policy.score_work.elements))
        assert torch.equal(outcomes[0][0], outcomes[1][0]) and torch.equal(outcomes[0][1], outcomes[1][1])
        assert outcomes[0][2] == outcomes[1][2]
        if policy.needs_scores:
            assert len(record.scores) == 1


def _official_reference_kept(model, ids, k: int, w: int, steps: int) -> dict:
    """The released code's rule, re-implemented from the stock model's own attention (noise off, tau = 1):
    key tokens = top (k - w) of the prompt's column sums among positions [0, n - w) per layer and KV head,
    frozen; after decode step s the cache holds them plus the w - 1 newest tokens (positions up to n + s)."""
    out = model(input_ids=ids, output_attentions=True, use_cache=False)
    n = ids.shape[1]
    kept = {}
    for layer, attn in enumerate(out.attentions):  # (1, H_q, n, n)
        heads = attn.shape[1] // kv_group(model)
        scores = attn[0].float().sum(dim=1).view(heads, kv_group(model), n).sum(dim=1)  # (H_kv, n)
        keys = scores[:, : n - w].topk(k - w, dim=-1).indices.sort(dim=-1).values
        for step in range(-1, steps):
            newest = n - 1 + (step + 1)
            window = torch.arange(newest - w + 2, newest + 1).expand(heads, w - 1)
            kept[(step, layer)] = torch.cat([keys, window], dim=-1).sort(dim=-1).values.unsqueeze(0)
    return kept


@pytest.mark.parametrize("arch", ["gpt2", "gptj", "llama_gqa", "neox"])
def test_official_selection_equals_a_direct_reimplementation(arch):
    """selection='official': keys chosen at the prompt then frozen, the w newest tokens including the incoming
    one, exactly k attended; kept sets and decode logits against the rule applied to the stock model."""
    model = build(arch)
    ids = prompt(seed=21)
    policy = make_policy("keyformer", cache_ratio=0.5, recent_ratio=0.3, noise="none", tau_init=1.0,
                         tau_end=1.0, selection="official")
    seen = {}
    policy.add_observer(lambda e: seen.__setitem__((e.step, e.layer), e.kept_positions.clone()))
    with prefill(model, policy, ids) as state:
        k, w = int(policy.budget[0]), int(policy.recent[0])
        ours = [decode_one_token(state).clone() for _ in range(STEPS)]
        fed = state.generated[:STEPS]
    assert (k, w) == (PROMPT_LEN // 2, 3)
    expected = _official_reference_kept(model, ids, k, w, STEPS)
    for key, kept in expected.items():
        assert torch.equal(seen[key], kept), key
        assert kept.shape[-1] == k - 1  # + the incoming token = exactly k attended
    reference = masked_reference_logits(model, ids, fed, expected, kv_group(model))
    for step, (a, b) in enumerate(zip(ours, reference)):
        assert torch.allclose(a, b, atol=TOL, rtol=0), (step, (a - b).abs().max())
    with pytest.raises(ValueError, match="selection"):
        make_policy("keyformer", selection="frozen")
    with pytest.raises(ValueError, match="recent window"):
        with prefill(model, make_policy("keyformer", selection="official", recent_ratio=0.0), ids):
            pass


def test_padded_budget_base_keeps_short_prompts_whole_until_the_cache_grows():
    """budget_base='padded' with the paper's re-ranking: k = p * max(pad_length, n), the pads ranking below
    every real token. A 24-token prompt padded to 40 at p = 0.8 gets k = 32: nothing is evicted until 32
    tokens are held, and until then the logits are the stock model's; then the cache stays there. (Official
    selection: the released masking, tests/keyformer/test_released_code.py.)"""
    model = build("llama_gqa")
    ids = prompt()
    policy = make_policy("keyformer", cache_ratio=0.8, budget_base="padded", pad_length=40, max_new_tokens=16)
    hold = 32
    lengths = []
    with prefill(model, policy, ids) as state:
        assert int(policy.budget[0]) == 32 and policy.kv_lengths() == [PROMPT_LEN] * 2
        ours = [state.logits.clone()]
        for _ in range(14):
            ours.append(decode_one_token(state).clone())
            lengths.append(policy.kv_lengths()[0])
        fed = state.generated[:-1]
    assert lengths == [min(PROMPT_LEN + s + 1, hold) for s in range(14)]
    reference = stock_logits(model, ids, fed)
    unevicted = hold - PROMPT_LEN + 1  # steps whose attention still sees every token
    for step in range(unevicted):
        assert torch.allclose(ours[step], reference[step], atol=TOL, rtol=0), step
    assert not torch.allclose(ours[-1], reference[len(ours) - 1], atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="budget_base"):
        make_policy("h2o", budget_base="max_length")


@pytest.mark.parametrize("pooling", ["avg", "max"])
def test_snapkv_selects_from_the_pooled_observation_window(pooling):
    """SnapKV's rule applied to the stock model's attention: the last W queries' attention summed over them
    and over the query heads of a KV group, pooled along the prefix only (the first n - W keys, as the
    references slice `[..., :-window]` before pooling), top (k - W) of them, plus the window; decoding
    appends every token."""
    import torch.nn.functional as F

    model = build("llama_gqa")
    ids = prompt(length=40, seed=31)
    window, kernel = 6, 5
    policy = make_policy("snapkv", cache_ratio=0.5, window=window, kernel=kernel, pooling=pooling)
    with prefill(model, policy, ids) as state:
        k = int(policy.budget[0])
        held = [policy.kept_positions(i).clone() for i in range(len(policy.layers))]
        decode_n_tokens(state, 3)
        assert policy.kv_lengths() == [k + 3] * len(policy.layers)
    out = model(input_ids=ids, output_attentions=True, use_cache=False)
    n, group = ids.shape[1], kv_group(model)
    for layer, attn in enumerate(out.attentions):
        votes = attn[0, :, n - window:].float().sum(dim=1)  # (H_q, n)
        votes = votes.view(-1, group, n).sum(dim=1).unsqueeze(1)  # (H_kv, 1, n)
        pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
        pooled = pool(votes[..., : n - window], kernel, stride=1, padding=kernel // 2).squeeze(1)
        top = pooled.topk(k - window, dim=-1).values
        ours = held[layer][0]
        assert bool((ours[:, -window:] == torch.arange(n - window, n)).all()), layer  # the window is kept
        # the key tokens carry the top pooled scores (max pooling makes ties: compare values, not indices)
        chosen = pooled.gather(1, ours[:, :-window]).sort(dim=-1, descending=True).values
        assert torch.allclose(chosen, top, atol=1e-6), layer


def test_tova_ranks_by_the_current_query_averaged_over_all_heads():
    """TOVA keeps the top k of the last query's attention averaged over every head of the layer: at the
    prompt (against the stock model) and at every step, one token leaves all KV heads of a layer together."""
    model = build("llama_gqa")
    ids = prompt(length=30, seed=32)
    policy = make_policy("tova", cache_ratio=0.4)
    seen = []
    policy.add_observer(lambda e: seen.append(e))
    with prefill(model, policy, ids) as state:
        k = int(policy.budget[0])
        decode_n_tokens(state, 4)
    out = model(input_ids=ids, output_attentions=True, use_cache=False)
    for event in seen:
        held = event.kept_positions[0]  # (H_kv, k)
        assert held.shape[-1] == k and all(torch.equal(held[0], h) for h in held)  # same set on every head
        if event.step == -1:
            last = out.attentions[event.layer][0, :, -1].float().mean(dim=0)  # (n,)
            assert torch.equal(held[0], last.topk(k).indices.sort().values)
