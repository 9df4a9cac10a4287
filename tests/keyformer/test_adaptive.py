"""The adaptive-budget policies (mass, pyramidkv, adakv): lengths that vary per layer, head and step, their
selection rules against direct re-implementations on the stock model's attention, and what the matrix of
tests/keyformer/test_policies.py checks for them (check_adaptive_lengths)."""
from __future__ import annotations

import pytest
import torch

from keyformer import make_policy
from keyformer.generate import decode_n_tokens, prefill
from keyformer.pyramidkv import pyramid_budgets
from tests.keyformer.tiny_models import VOCAB, build


def prompt(length, seed):
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def held_counts(event) -> list[int]:
    return (event.kept_positions[0] >= 0).sum(-1).tolist()


H2O = {"scoring": "h2o"}  # pyramidkv's and adakv's H2O-allocation variants (kvsim's earlier rules)
REFERENCE_WINDOW = 4  # the matrix's prompts are 24 tokens: the references' windows (8, 32) would fill k


def check_adaptive_lengths(name, model, ids, steps):
    """Matrix check (every architecture): mass and the H2O-allocation variants of pyramidkv and adakv evict
    every step (check_evicting_lengths); the references' pyramidkv and adakv compress the prompt once, then
    grow (check_reference_lengths)."""
    check_evicting_lengths(name, model, ids, steps)
    if name in ("pyramidkv", "adakv"):
        check_reference_lengths(name, model, ids, steps)


def check_reference_lengths(name, model, ids, steps):
    """Reference pyramidkv / adakv: after the prompt each head holds its share of the prefix plus the
    observation window, then every generated token is appended (nothing leaves); events and kv_lengths report
    the fullest head."""
    policy = make_policy(name, cache_ratio=0.5, window=REFERENCE_WINDOW)
    events = []
    policy.add_observer(events.append)
    n = ids.shape[1]
    with prefill(model, policy, ids) as state:
        k, w = int(policy.budget[0]), int(policy.recent[0])
        assert (k, w) == (n // 2, REFERENCE_WINDOW)
        decode_n_tokens(state, steps)
    at_prompt = {}
    for event in events:
        if policy.layers[event.layer].window is not None:
            continue  # sliding-window layers keep their window: check_evicting_lengths
        counts = held_counts(event)
        assert event.kv_len == max(counts)
        held = as_sets(event.kept_positions[0])
        newest = n - 1 + (event.step + 1)
        if event.step == -1:
            at_prompt[event.layer] = counts
            if name == "pyramidkv":
                assert len(set(counts)) == 1  # one budget per layer
            else:
                per_head = k - w
                assert all(c >= w + int(0.5 * per_head) for c in counts)
                assert abs(sum(counts) - len(counts) * k) <= len(counts)  # rounding of the shares
        else:
            assert counts == [c + event.step + 1 for c in at_prompt[event.layer]]
        for kept in held:
            assert set(range(n - w, newest + 1)) <= kept  # the window and everything generated stay
    if name == "pyramidkv":
        depth = [at_prompt[i][0] for i in sorted(at_prompt)]
        assert depth == sorted(depth, reverse=True)


def check_evicting_lengths(name, model, ids, steps):
    """The budget k, the recent window on every head, each policy's bound on what a head / a layer holds, a
    buffer of capacity + 1 slots reused in place (mass, pyramidkv), and events and kv_lengths reporting the
    fullest head."""
    policy = make_policy(name, cache_ratio=0.5, **({} if name == "mass" else H2O))
def peaked_llama():
    """llama_gqa with the query heads of KV head 0 sharpened (x8) and those of KV head 1 flattened (x0.3): one
    head attends to a few tokens, the other broadly, so adaptive budgets differ between them."""
    model = build("llama_gqa")
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        for layer in model.model.layers:
            q = layer.self_attn.q_proj.weight
            q[: 2 * head_dim] *= 8.0
            q[2 * head_dim:] *= 0.3
    return model


def prompt_scores(model, ids):
    """H2O's prompt scores per layer from the stock model: column sums of the causal softmax, summed over the
    query heads of each KV group, (H_kv, n) float64."""
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, use_cache=False)
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    n = ids.shape[1]
    return [a[0].double().sum(dim=1).view(-1, group, n).sum(dim=1) for a in out.attentions]


def kept_at_prompt(policy, model, ids, steps=0):
    seen = {}
    policy.add_observer(lambda e: seen.__setitem__((e.step, e.layer), e.kept_positions[0].clone()))
    with prefill(model, policy, ids) as state:
        decode_n_tokens(state, steps)
    return seen


def as_sets(held):
    return [set(h[h >= 0].tolist()) for h in held]


@pytest.mark.parametrize("mass", [0.5, 0.8])
def test_mass_keeps_the_fewest_tokens_covering_the_share(mass):
    """At the prompt: the window, then the others by descending score until the share is covered (at most k),
    against the stock model's column sums; heads differ in length, and decoding keeps varying them."""
    model = peaked_llama()
    ids = prompt(40, seed=41)
    n = ids.shape[1]
    policy = make_policy("mass", cache_ratio=0.5, mass=mass)
    seen = kept_at_prompt(policy, model, ids, steps=8)
    k, w = 20, 6
    lengths = set()
    for layer, scores in enumerate(prompt_scores(model, ids)):
        for head, row in enumerate(scores):
            covered, target = float(row[n - w:].sum()), mass * float(row.sum())
            expected = set(range(n - w, n))
            for j in row[: n - w].argsort(descending=True).tolist():
                if covered >= target or len(expected) >= k:
                    break
                expected.add(j)
                covered += float(row[j])
            assert as_sets(seen[(-1, layer)])[head] == expected, (layer, head)
        lengths |= {len(s) for key, held in seen.items() if key[1] == layer for s in as_sets(held)}
    assert len(lengths) > 2  # per head and step
    assert all(w <= length <= k for length in lengths)


def test_mass_one_is_h2o():
    """mass = 1 keeps the window and every other scored token up to k: H2O's kept sets at every step."""
    model = build("gpt2")
    ids = prompt(24, seed=42)
    ours = kept_at_prompt(make_policy("mass", cache_ratio=0.5, mass=1.0), model, ids, steps=6)
    h2o = kept_at_prompt(make_policy("h2o", cache_ratio=0.5), model, ids, steps=6)
    assert ours.keys() == h2o.keys()
    for key in ours:
        assert as_sets(ours[key]) == as_sets(h2o[key]), key


def test_pyramid_schedule():
    """Linear in depth, mean exactly k, top layer w + (k - w) // beta, flattened when the first layer would
    exceed the prompt (k = n gives n everywhere)."""
    one = lambda k, w, ceiling, layers, beta=20.0: pyramid_budgets(torch.tensor([k]), torch.tensor([w]),
                                                                  torch.tensor([ceiling]), layers, beta)[0].tolist()
    assert one(20, 6, 40, 2) == [34, 6]
    budgets = one(100, 30, 1000, 7)
    assert sum(budgets) == 700 and budgets == sorted(budgets, reverse=True) and budgets[-1] == 30 + 70 // 20
    assert max(b - a for a, b in zip(budgets[1:], budgets)) - min(b - a for a, b in zip(budgets[1:], budgets)) <= 1
    assert one(24, 7, 24, 2) == [24, 24]              # k = n: nothing to redistribute
    flat = one(30, 9, 40, 4)                          # 2e - top = 42 > n - w = 31: flattened
    assert flat[0] == 40 and sum(flat) == 120 and flat == sorted(flat, reverse=True)
    assert one(50, 15, 1000, 1) == [50]
    assert one(10, 3, 100, 3, beta=1.0) == [10, 10, 10]   # beta = 1: top = e, a flat schedule


def test_pyramidkv_selects_within_each_layer_by_h2o_scores():
    model = peaked_llama()
    ids = prompt(40, seed=43)
    n = ids.shape[1]
    policy = make_policy("pyramidkv", cache_ratio=0.5, **H2O)
    seen = kept_at_prompt(policy, model, ids)
    budgets = [34, 6]  # k = 20, w = 6: test_pyramid_schedule
    for layer, scores in enumerate(prompt_scores(model, ids)):
        for head, row in enumerate(scores):
            top = row[: n - 6].topk(budgets[layer] - 6).indices.tolist()
            assert as_sets(seen[(-1, layer)])[head] == set(top) | set(range(n - 6, n)), (layer, head)


def test_adakv_shares_the_layer_budget_across_heads():
    """At the prompt: the layer's H x k less the windows go to the top scores over both KV heads jointly; the
    sharp head keeps fewer tokens than the broad one, the layer total stays H x k at every step."""
    model = peaked_llama()
    ids = prompt(40, seed=44)
    n, k, w = 40, 20, 6
    policy = make_policy("adakv", cache_ratio=0.5, **H2O)
    seen = kept_at_prompt(policy, model, ids, steps=8)
    for layer, scores in enumerate(prompt_scores(model, ids)):
        heads = scores.shape[0]
        candidates = scores[:, : n - w]
        flat = candidates.reshape(-1).topk(heads * (k - w)).indices
        expected = [set(range(n - w, n)) for _ in range(heads)]
        for i in flat.tolist():
            expected[i // (n - w)].add(i % (n - w))
        assert as_sets(seen[(-1, layer)]) == expected, layer
    for key, held in seen.items():
        assert sum(len(s) for s in as_sets(held)) == 2 * k, key


def test_adakv_heads_win_what_their_scores_earn():
    """The joint rule on scores where one head is sharp (two tokens carry its score) and one broad: the broad
    head takes most of the layer's budget, the sharp one keeps its two plus its window; empty slots never."""
    policy = make_policy("adakv", cache_ratio=0.5, **H2O)
    policy.hold = torch.tensor([4])
    positions = torch.arange(10).expand(1, 2, 10).clone()
    positions[0, 1, 9] = -1  # an empty slot
    scores = torch.tensor([[[5.0, 4.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0],
                            [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 0.9, 0.8, 0.0, 9.0]]])
    protected = positions >= 8  # the window: positions 8 and 9
    keep = policy.keep_mask(None, positions, scores, protected)
    kept = [set(torch.nonzero(row).flatten().tolist()) for row in keep[0]]
    # 2 x 4 = 8 in all, 3 window slots (8, 9 on head 0; 8 on head 1): 5 won, 2 by head 0, 3 by head 1
    assert kept == [{0, 1, 8, 9}, {3, 4, 5, 8}]


def test_adaptive_policies_refuse_renumbered_positions():
    for name in ("mass", "pyramidkv", "adakv"):
        with pytest.raises(ValueError, match="renumber"):
            make_policy(name, position_mode="renumber")
    with pytest.raises(ValueError, match="mass"):
        make_policy("mass", mass=0.0)


@pytest.mark.parametrize("arch", ["llama_gqa", "mpt"])
def test_adakv_grows_the_buffer_of_a_head_that_wins_more_than_k(arch):
    """Scores tilted towards KV head 0 after the prompt: at every step head 0 keeps its newcomer and wins the
    token head 1 loses while the newcomer is in its window, so head 0 exceeds k and fills its slots; the buffer grows, and the decode logits still
    equal the full cache with the evicted keys masked."""
    from tests.keyformer.reference import masked_reference_logits

    model = build(arch)
    ids = prompt(24, seed=45)
    policy = make_policy("adakv", cache_ratio=0.5, **H2O)
    kept = {}
    policy.add_observer(lambda e: kept.__setitem__((e.step, e.layer), e.kept_positions.clone()))
    steps = 5
    with prefill(model, policy, ids) as state:
        k = int(policy.budget[0])
        slots = [layer.keys.shape[-2] for layer in policy.layers]
        for layer in policy.layers:
            layer.scores[:, 0] += 100.0 * (layer.positions[:, 0] >= 0)
        ours = [decode_n_tokens(state, 1) is not None and state.logits.clone() for _ in range(steps)]
        fed = state.generated[:steps]
        grown = [layer.keys.shape[-2] for layer in policy.layers]
    heads = policy.layers[0].positions.shape[1]
    for step in range(steps):
        counts = (kept[(step, 0)][0] >= 0).sum(-1).tolist()
        # + its newcomers while they are in the window (w = 3), at the expense of head 1
        assert counts[0] == k + min(step + 1, 3) and sum(counts) == heads * k
    assert all(g > s for g, s in zip(grown, slots))
    group = model.config.num_attention_heads // (getattr(model.config, "num_key_value_heads", None)
                                                 or model.config.num_attention_heads)
    reference = masked_reference_logits(model, ids, fed, kept, group)
    for step, (a, b) in enumerate(zip(ours, reference)):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (step, (a - b).abs().max())


def window_votes_pooled(model, ids, window, kernel=7):
    """The references' vote from the stock model: the last `window` queries' attention on the prefix
    [0, n - window), summed over them and over the query heads of a KV group, max-pooled over the prefix
    only; (H_kv, n - window) per layer."""
    import torch.nn.functional as F

    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, use_cache=False)
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    n = ids.shape[1]
    pooled = []
    for attn in out.attentions:
        votes = attn[0, :, n - window:, : n - window].double().sum(dim=1)  # (H_q, n - window)
        votes = votes.view(-1, group, n - window).sum(dim=1).unsqueeze(1)
        pooled.append(F.max_pool1d(votes, kernel, stride=1, padding=kernel // 2).squeeze(1))
    return pooled


def test_reference_pyramid_schedule():
    """The released integer rule: uniform e when n < 2e, the whole prefix when n <= C, otherwise max_num -
    l * steps with steps floored (so the layers' mean is not exactly e)."""
    from keyformer.pyramidkv import reference_pyramid

    assert reference_pyramid(20, 8, 40, 2, 20) == [24, 0]           # e = 12, high 24, low 0
    assert reference_pyramid(20, 8, 22, 2, 20) == [12, 12]          # n < 2e: every layer keeps e
    assert reference_pyramid(20, 8, 20, 3, 20) == [12, 12, 12]      # n = C: the whole prefix
    budgets = reference_pyramid(128, 8, 1000, 32, 20)               # e = 120: low 6, high 234, steps 7
    assert budgets[0] == 234 and budgets[-1] == 234 - 31 * 7 and sum(budgets) != 120 * 32
    # n = 2e: high 234 clipped to n - w = 232, low = 2e - 232 = 8, steps (232 - 8) // 3 = 74
    assert reference_pyramid(128, 8, 240, 4, 20) == [232, 158, 84, 10]


def test_pyramidkv_reference_selects_once_from_the_pooled_window_votes():
    """Reference pyramidkv against the rule on the stock model: window 8, kernel 7 max pooling over the
    prefix, each layer its integer budget, then the cache appends every token."""
    from keyformer.pyramidkv import reference_pyramid

    model = peaked_llama()
    ids = prompt(40, seed=46)
    n, window = 40, 8
    policy = make_policy("pyramidkv", cache_ratio=0.5)
    seen = kept_at_prompt(policy, model, ids, steps=4)
    assert int(policy.recent[0]) == window
    budgets = reference_pyramid(20, window, n, 2, 20)
    for layer, pooled in enumerate(window_votes_pooled(model, ids, window)):
        for head, row in enumerate(pooled):
            chosen = as_sets(seen[(-1, layer)])[head]
            assert chosen >= set(range(n - window, n)) and len(chosen) == budgets[layer] + window
            picked = torch.tensor(sorted(chosen - set(range(n - window, n))), dtype=torch.long)
            top = row.topk(budgets[layer]).values if budgets[layer] else row[:0]
            assert torch.allclose(row[picked].sort(descending=True).values, top, atol=1e-6), (layer, head)
        assert as_sets(seen[(3, layer)]) == [s | set(range(n, n + 4)) for s in as_sets(seen[(-1, layer)])]


def test_adakv_reference_shares_the_prefix_budget_with_a_floor():
    """Reference adakv: B = k - window per head; the joint top H x B of the pooled votes gives head h a count
    c_h, and it keeps its own top round(c_h / 2 + int(B / 2)) plus the window; then the cache grows."""
    model = peaked_llama()
    ids = prompt(40, seed=47)
    n, k, window = 40, 20, 8
    policy = make_policy("adakv", cache_ratio=0.5, window=window)
    seen = kept_at_prompt(policy, model, ids, steps=3)
    per_head = k - window
    shares = set()
    for layer, pooled in enumerate(window_votes_pooled(model, ids, window)):
        heads, prefix = pooled.shape
        joint = pooled.reshape(-1).topk(heads * per_head).indices // prefix
        counts = torch.bincount(joint, minlength=heads).double()
        caps = torch.round(counts * 0.5 + int(per_head * 0.5)).long().tolist()
        shares |= set(caps)
        for head, row in enumerate(pooled):
            chosen = as_sets(seen[(-1, layer)])[head] - set(range(n - window, n))
            assert len(chosen) == caps[head], (layer, head)
            picked = torch.tensor(sorted(chosen), dtype=torch.long)
            assert torch.allclose(row[picked].sort(descending=True).values, row.topk(caps[head]).values, atol=1e-6)
        assert as_sets(seen[(2, layer)]) == [s | set(range(n, n + 3)) for s in as_sets(seen[(-1, layer)])]
    assert len(shares) > 1  # the sharp and the broad head get different shares
