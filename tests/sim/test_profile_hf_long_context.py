"""The `hf` profile at long context on a GPU (issue 25): a decode step grows with the context by the bytes the
transformers 5.24 stack moves per cached token (SDPA's read of K and V, DynamicCache's torch.cat reading and
writing them again), generate()'s fp32 logits copy is an operator of its own, and a policy that compresses
each layer right after that layer's prefill (kvpress-style hooks) peaks at one layer's prompt plus the kept
tokens of the others, below the whole-prompt peak by exactly the KV it no longer holds."""
import numpy as np
import pytest

import sim.profiles.hf  # noqa: F401  (registers `hf` without importing every profile module)
from hwmodels import load_device
from sim import engine
from sim.engine import memory_bytes
from sim.models import load_model

HW, MODEL = "a100-80g-sxm", "llama-3.1-8b"


def _decode(prompt, policy="full", ratio=1.0):
    return engine.predict(HW, MODEL, 1, prompt, 2, policy, ratio, profile="hf")


def _step_kv_bytes(p):
    ops = p.decode_ops[p.decode_ops["step"] == "mean"]
    return float((ops["kv_read_bytes"] + ops["kv_write_bytes"]).sum())


def test_decode_grows_with_context_by_three_passes_over_the_cache():
    m = load_model(MODEL)
    per_token = 2 * m.n_layers * m.n_kv_heads * m.head_dim * 2          # K and V of every layer, bf16
    short, long = _decode(32768), _decode(131072)
    added = 131072 - 32768
    # SDPA reads K and V once; torch.cat reads the old cache and writes the new one: 3 passes per token
    assert _step_kv_bytes(long) - _step_kv_bytes(short) == pytest.approx(3 * per_token * added, rel=1e-6)
    # and the time follows those bytes: no faster than the HBM peak, no slower than half of it
    slope = (long.tpot_s - short.tpot_s) / added
    peak_bw = load_device(HW).memory_bw
    assert 3 * per_token / peak_bw <= slope <= 3 * per_token / (0.5 * peak_bw)
    names = set(long.decode_ops["op"])
    assert {"cache_concat", "logits_fp32"} <= names and "repeat_kv" not in names   # SDPA runs GQA natively


def test_generate_copies_the_last_logits_to_fp32_every_step():
    m, p = load_model(MODEL), _decode(1024)
    row = p.decode_ops[(p.decode_ops["step"] == "mean") & (p.decode_ops["op"] == "logits_fp32")].iloc[0]
    assert row["act_bytes"] == pytest.approx(m.vocab_size * (2 + 4 + 4))      # bf16 read, fp32 written and read
    assert "logits_fp32" in set(p.prefill_ops["op"])                         # the first token's too
    assert "logits_fp32" not in set(engine.predict(HW, MODEL, 1, 1024, 2, "full", 1.0).decode_ops["op"])


def test_layerwise_prefill_compression_peaks_below_the_whole_prompt_by_the_evicted_kv():
    m, n, ratio = load_model(MODEL), 131072, 0.25
    k = n * ratio
    p = engine.predict(HW, MODEL, 1, n, 16, "snapkv", ratio, profile="hf")
    layers = m.n_layers
    assert p.extra["peak_kv_tokens"] == pytest.approx((n + (layers - 1) * k) / layers)
    whole = memory_bytes(MODEL, 1, n, prompt=n, policy="snapkv", profile="hf", hw=HW)
    evicted = (layers - 1) * (n - k) * 2 * m.n_kv_heads * m.head_dim * 2    # bytes of the L - 1 compressed layers
    assert float(whole) - p.peak_memory_bytes == pytest.approx(evicted, rel=1e-9)
    # a fused engine evicts once the prefill ends (the whole prompt in every layer), full attention keeps it
    assert engine.predict(HW, MODEL, 1, n, 16, "snapkv", ratio).extra["peak_kv_tokens"] == n
    assert engine.predict(HW, MODEL, 1, n, 16, "full", 1.0, profile="hf").extra["peak_kv_tokens"] == n + 16
    # the decode-time peak wins once the kept cache plus the generated tokens exceed the layer-wise prefill
    long_gen = engine.predict(HW, MODEL, 1, n, 60000, "snapkv", ratio, profile="hf")
    assert long_gen.extra["peak_kv_tokens"] == pytest.approx(k + 60000)


def test_hf_holds_the_concatenated_cache_the_third_mlp_tensor_and_both_logits():
    import dataclasses
    from sim.capacity import memory
    from sim.engine import make_setup
    m, n, rows = load_model(MODEL), 8192, 2.0
    bare = dataclasses.replace(sim.profiles.hf.HF, name="hf-without-buffers", extra_memory_bytes=None)
    with_buffers, without = (float(memory(make_setup(HW, MODEL, "full", "bf16", "bf16", prof), rows, n, n))
                             for prof in ("hf", bare))
    one_layer_kv = n * 2 * m.n_kv_heads * m.head_dim * 2       # torch.cat's output beside its input
    third_mlp = n * m.d_ff * 2                                   # act(gate) * up beside act(gate) and up
    bf16_logits = m.vocab_size * 2                               # beside the fp32 copy the shared rule counts
    assert with_buffers - without == pytest.approx(rows * (one_layer_kv + third_mlp + bf16_logits))


def test_the_layerwise_peak_through_sim_predict(capsys):
    import json

    from sim import predict
    argv = ["--hw", HW, "--model", MODEL, "--prompt", "65536", "--gen", "16", "--profile", "hf", "--json"]

    def run(*extra):
        assert predict.main(argv + list(extra)) == 0
        out = capsys.readouterr().out
        return json.loads(out[out.index("{"):])
    m = load_model(MODEL)
    full, snap = run("--policy", "full"), run("--policy", "snapkv", "--cache-ratio", "0.25")
    n, k, layers = 65536, 16384, m.n_layers
    assert snap["peak_kv_tokens"] == pytest.approx((n + (layers - 1) * k) / layers)
    per_token_all_layers = 2 * layers * m.n_kv_heads * m.head_dim * 2
    saved = (n + 16 - snap["peak_kv_tokens"]) * per_token_all_layers
    # the KV no longer held, less the 16 generated tokens of torch.cat's extra layer that full attention holds
    assert full["peak_memory_bytes"] - snap["peak_memory_bytes"] == pytest.approx(
        saved + 16 * per_token_all_layers / layers, rel=1e-9)


def test_gpu_decode_attention_runs_at_the_flash_attention_family_rate():
    from sim.profiles import attention
    from sim.profiles.hf import _kernel_terms
    m, device = load_model(MODEL), load_device(HW)
    v = _kernel_terms()

    def attention_s(prompt):
        p = _decode(prompt)
        ops = p.decode_ops[p.decode_ops["step"] == "mean"].set_index("op")
        return float(ops.loc["attn_scores", "time_s"]), float(ops.loc["attn_scores", "kv_read_bytes"]) * 2
    for prompt in (1024, 131072):
        t, kv = attention_s(prompt)
        per_layer = kv / m.n_layers
        eff = attention.stream_eff("tensor-core", per_layer, device.memory_bw, v)
        kernel = m.n_layers * per_layer / (device.memory_bw * eff)
        assert kernel <= t <= kernel + m.n_layers * 2 * device.launch_overhead_s + 1e-6   # bytes + the SDPA launch
    # a short single sequence is latency-bound: at least the family's fixed time per layer
    assert attention_s(1024)[0] >= m.n_layers * v["attn_latency_s"]
