"""kvsim's simulator side: what KV-cache reduction buys on given hardware (never imports torch).

    from sim.engine import predict
    p = predict("h100-sxm", "llama-3-8b", batch=8, prompt=4096, gen=512, policy="keyformer", cache_ratio=0.5)
    p.tpot_s, p.max_batch, p.decode_ops

Modules: models (HF configs -> ModelSpec), kvlen (tokens held per policy), ops (operator FLOPs/bytes),
profiles (software stacks), engine (roofline, memory, capacity), predict / sweep / bench (CLIs),
plots, cli (shared CLI plumbing). The operator model is documented in docs/sim.md.
"""
