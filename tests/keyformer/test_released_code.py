"""Keyformer against the released code (d-matrix-ai/keyformer-llm, issue 26): the left-padded budget base
against a direct re-implementation of the released masking, its budget rounding, the beams' summed prompt
noise, and noise streams seeded per run and per sample; SnapKV's pooling over the prefix only, as its
references (pyramidkv's and adakv's references: tests/keyformer/test_adaptive.py)."""
from __future__ import annotations

import math

import pytest
import torch

from keyformer import make_policy
from keyformer.base import percent_of
from keyformer.generate import decode_n_tokens, decode_one_token, prefill
from keyformer.keyformer import stream_seed
from tests.keyformer.reference import masked_reference_logits
from tests.keyformer.tiny_models import VOCAB, build

STEPS = 12


def prompt(length, seed=0, batch=1):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def kv_group(model):
    config = model.config
    return config.num_attention_heads // (getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def released_masks(model, ids, pad_to: int, kv_cache: int, recent: int, steps: int) -> dict:
    """The released attention function's token masks, re-implemented on the prompt left-padded to
    S = max(pad_to, n) (noise off, tau = 1), in real-token positions.

    Per layer and KV head, as `scaled_multihead_dot_product_attention` does: at the prompt the score is the
    column sum of the causal softmax over all S query rows; a pad row's logits are all the dtype's minimum
    (padding and causal masks), so its softmax is uniform: 1/S on every column. k = int(S * kv_cache / 100),
    w = int(k * recent / 100). Each forward over s_k keys builds a mask of s_k + 1 entries (the last is the
    token the next step appends): when s_k > k, the first s_k + 1 - w are zeroed, the top (k - w) of the
    scores of the first s_k - w keys are set again, the result is AND-ed with the previous mask, and the
    scores are multiplied by it. A decode step's own scores are positive on the tokens it attends (held real
    tokens and itself) and 0 on masked ones; they cannot re-rank a held key against a discarded token (0), so
    a uniform positive row stands in for them. Returns {(step, layer): (1, H_kv, m)} for the state after the
    prompt (step -1) and after each decode step s: the real positions the next step attends besides its own
    token, as the policies' observers report them."""
    n = ids.shape[1]
    size = max(pad_to, n)
    pad = size - n
    k = int(size * kv_cache / 100)
    w = int(k * recent / 100)
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, use_cache=False)
    group = kv_group(model)
    kept = {}
    for layer, attn in enumerate(out.attentions):  # (1, H_q, n, n) real rows over real keys
        real = attn[0].double().sum(dim=1)  # column sums over the queries
        real = real.view(-1, group, n).sum(dim=1)  # (H_kv, n)
        heads = real.shape[0]
        score = torch.full((heads, size), pad / size, dtype=torch.float64)
        score[:, pad:] += real
        mask = None
        length = size  # keys of the current forward
        for t in range(steps + 1):
            if t > 0:  # decode: the new query's scores on what it attends (held real keys and itself)
                attended = torch.cat([mask[:, :-1], torch.ones(heads, 1)], dim=1).bool()
                attended[:, :pad] = False  # padding is masked for every query
                row = attended.double() / attended.sum(-1, keepdim=True)
                row[:, :-1] += score
                score = row
            token_mask = torch.ones(heads, length + 1, dtype=torch.float64)
            if length > k:
                token_mask[:, : length + 1 - w] = 0
                keys = score[:, : length - w].topk(k - w, dim=-1).indices
                token_mask.scatter_(-1, keys, 1.0)
            if mask is not None:
                token_mask[:, :-1] = torch.logical_and(mask.bool(), token_mask[:, :-1].bool()).double()
            mask = token_mask
            score = score * mask[:, :-1]
            held = [torch.nonzero(row[pad:length]).flatten() for row in mask]  # real positions, incoming excluded
            width = max(len(h) for h in held)
            kept[(t - 1, layer)] = torch.stack([torch.cat([h, h.new_full((width - len(h),), -1)]) for h in held])[None]
            length += 1
    return kept


@pytest.mark.parametrize("arch", ["llama_gqa", "gpt2"])
@pytest.mark.parametrize("n", [10, 40, 60, 100])
def test_padded_budget_base_is_the_released_left_padded_masking(arch, n):
    """budget_base='padded', selection='official' against the released masking on the prompt left-padded to
    96 (k = 48, w = 14): n = 10 (window over pads first), 40 (kept whole but the hole), 60 (n > k: keys by
    score), 100 (longer than the pad length: no pads, k = 50); kept sets at every step and decode logits."""
    model = build(arch)
    ids = prompt(n, seed=n)
    policy = make_policy("keyformer", cache_ratio=0.5, recent_ratio=0.3, budget_base="padded", pad_length=96,
                         selection="official", noise="none", tau_init=1.0, tau_end=1.0)
    seen = {}
    policy.add_observer(lambda e: seen.__setitem__((e.step, e.layer), e.kept_positions.clone()))
    with prefill(model, policy, ids) as state:
        ours = [decode_one_token(state).clone() for _ in range(STEPS)]
        fed = state.generated[:STEPS]
    expected = released_masks(model, ids, 96, 50, 30, STEPS)
    assert int(policy.budget[0]) == (50 if n > 96 else 48)
    for key, kept in expected.items():
        assert torch.equal(seen[key], kept), (key, seen[key], kept)
    if n == 40:  # the worked example: step 10 leaves out 26..36
        attended = set(seen[(9, 0)][0, 0].tolist()) | {n + 10}
        assert attended == set(range(26)) | set(range(37, 51))
        assert all(seen[(s, 0)].shape[-1] == n - 1 for s in range(-1, STEPS))  # n attended with the newcomer
    reference = masked_reference_logits(model, ids, fed, expected, kv_group(model))
    for step, (a, b) in enumerate(zip(ours, reference)):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), (step, (a - b).abs().max())


def test_paper_selection_on_the_padded_base_grows_to_k_then_evicts():
    """Re-ranking every step, pads (never attended) rank below every real token: a short prompt is kept whole
    and the cache grows by one real token a step until it holds k."""
    model = build("llama_gqa")
    policy = make_policy("keyformer", cache_ratio=0.5, budget_base="padded", pad_length=96, max_new_tokens=16)
    lengths = []
    with prefill(model, policy, prompt(40, seed=3)) as state:
        for _ in range(12):
            decode_one_token(state)
            lengths.append(policy.kv_lengths()[0])
    assert int(policy.budget[0]) == 48 and lengths == [min(41 + s, 48) for s in range(12)]


def test_official_budgets_round_as_the_released_scripts():
    """k = int(n * P / 100), w = int(k * R / 100) (P, R the scripts' percentages) in official mode; the
    paper's floor(p * n) in float64 elsewhere. They differ for 143 of the lengths 1..8192 at p = 0.7."""
    lengths = torch.arange(1, 8193)
    released = torch.tensor([int(n * 70 / 100) for n in range(1, 8193)])
    assert torch.equal(percent_of(lengths, 0.7), released)
    floor = torch.tensor([math.floor(0.7 * n) for n in range(1, 8193)])
    differ = lengths[released != floor]
    assert len(differ) == 143
    assert torch.equal(percent_of(torch.tensor([61]), 0.29), torch.tensor([int(61 * 29 / 100)]))  # 0.29 * 100
    sample = differ[:3].tolist()
    width = max(sample)
    mask = torch.zeros(len(sample), width, dtype=torch.long)
    for row, n in enumerate(sample):
        mask[row, width - n:] = 1
    official = make_policy("keyformer", cache_ratio=0.7, selection="official")
    official.start_prompt(mask)
    assert official.budget.tolist() == [int(n * 70 / 100) for n in sample]
    assert official.recent.tolist() == [int(int(n * 70 / 100) * 30 / 100) for n in sample]
    paper = make_policy("keyformer", cache_ratio=0.7)
    paper.start_prompt(mask)
    assert paper.budget.tolist() == [math.floor(0.7 * n) for n in sample] != official.budget.tolist()


@pytest.mark.parametrize("beam_noise", ["shared", "summed"])
def test_beam_rows_share_or_sum_their_prompt_noise(beam_noise):
    """Four identical rows (the beams of one input): "shared" gives them one draw; "summed" gives each its
    own and ranks every row by the group's mean score (the released code's sum over the batch, same order),
    so the beams start from one key set either way."""
    model = build("llama_gqa")
    ids = prompt(40, seed=8).repeat(4, 1)
    policy = make_policy("keyformer", cache_ratio=0.4, selection="official", beam_noise=beam_noise,
                         max_new_tokens=4, seed=5)
    seen = []
    original = policy.finalize_prompt_scores

    def spy(scores):
        final = original(scores)
        seen.append((scores.clone(), final.clone()))
        return final
    policy.finalize_prompt_scores = spy
    with prefill(model, policy, ids):
        kept = [policy.kept_positions(i) for i in range(len(policy.layers))]
    n, k, w = 40, int(policy.budget[0]), int(policy.recent[0])
    for (rows, final), held in zip(seen, kept):
        assert all(torch.equal(held[0], held[b]) for b in range(1, 4))
        same = all(torch.equal(rows[0], rows[b]) for b in range(1, 4))
        assert same == (beam_noise == "shared")
        assert torch.allclose(final, rows.mean(dim=0, keepdim=True).expand_as(rows), atol=1e-6)
        keys = final[0][:, : n - w].topk(k - w, dim=-1).indices.sort(dim=-1).values
        assert torch.equal(held[0][:, : k - w], keys)
    with pytest.raises(ValueError, match="beam_noise"):
        make_policy("keyformer", beam_noise="each")


def _prompt_scores(policy, model, ids):
    with prefill(model, policy, ids):
        return [layer.scores.clone() for layer in policy.layers]


def test_noise_streams_are_seeded_per_run_and_per_sample():
    """A policy seeds each prompt's stream by (seed, sample index, replica): consecutive prompts draw
    different noise (the old generator restarted from the seed at every prefill), the same sample index
    draws the same noise in a fresh run, and another seed draws other noise."""
    model = build("llama_gqa")
    ids = prompt(30, seed=4)
    run = make_policy("keyformer", cache_ratio=0.5, max_new_tokens=4)
    first, second = _prompt_scores(run, model, ids), _prompt_scores(run, model, ids)
    assert not all(torch.equal(a, b) for a, b in zip(first, second))
    fresh = make_policy("keyformer", cache_ratio=0.5, max_new_tokens=4)
    fresh.sample_indices = [1]
    assert all(torch.equal(a, b) for a, b in zip(_prompt_scores(fresh, model, ids), second))
    other = make_policy("keyformer", cache_ratio=0.5, max_new_tokens=4, seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(_prompt_scores(other, model, ids), first))
    assert len({stream_seed(s, i, r) for s in range(3) for i in range(3) for r in range(3)}) == 27
    with pytest.raises(ValueError, match="sample_indices"):
        bad = make_policy("keyformer", cache_ratio=0.5, max_new_tokens=4)
        bad.sample_indices = [0, 1, 2]
        _prompt_scores(bad, model, ids)


def test_a_sample_draws_the_same_noise_in_any_batch():
    """Rows draw over their own extent (unpadded prompt, their own slots), so sample 7 keeps the same tokens
    alone and beside a longer prompt, at the prompt and at every decode step."""
    model = build("llama_gqa")
    short, long = prompt(20, seed=5), prompt(33, seed=6)
    alone = make_policy("keyformer", cache_ratio=0.5, max_new_tokens=6)
    alone.sample_indices = [7]
    trace_alone, trace_batch = [], []
    alone.add_observer(lambda e: trace_alone.append(e.kept_positions[0].clone()))
    with prefill(model, alone, short) as state:
        decode_n_tokens(state, 5)
    ids = torch.zeros(2, 33, dtype=torch.long)
    mask = torch.zeros(2, 33, dtype=torch.long)
    ids[0], mask[0] = long[0], 1
    ids[1, 13:], mask[1, 13:] = short[0], 1
    batched = make_policy("keyformer", cache_ratio=0.5, max_new_tokens=6)
    batched.sample_indices = [3, 7]
    batched.add_observer(lambda e: trace_batch.append(e.kept_positions[1].clone()))
    with prefill(model, batched, ids, mask) as state:
        decode_n_tokens(state, 5)
    assert len(trace_alone) == len(trace_batch)
    for a, b in zip(trace_alone, trace_batch):
        assert torch.equal(b[:, : a.shape[-1]], a) and bool((b[:, a.shape[-1]:] == -1).all())


def test_snapkv_pools_the_prefix_only():
    """The references slice the votes to the prefix before pooling: a prefix token next to the window is not
    lifted by the window's own (large) votes; the window's pooled scores are 0 (it is kept anyway)."""
    policy = make_policy("snapkv", cache_ratio=0.5, window=2, kernel=3, pooling="max")
    policy.prompt_positions = torch.arange(6).view(1, 6)
    policy.prompt_lengths = torch.tensor([6])
    scores = torch.tensor([[[1.0, 0.0, 0.0, 0.0, 9.0, 9.0]]])
    assert policy.finalize_prompt_scores(scores).tolist() == [[[1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]]
    policy.pooling = "avg"
    assert torch.allclose(policy.finalize_prompt_scores(scores), torch.tensor([[[1 / 3, 1 / 3, 0, 0, 0, 0]]]))
