"""The score cost of each scored policy: FLOPs per score element (one query head's probability, or logit, of
one kept key), the one figure keyformer/'s ScoreWork and the simulator's operator tables both read.

Counted as the roofline counts every elementwise op (sim's softmax is 5: max, subtract, exp, sum, divide;
a transcendental is one op like an add):
- keyformer: Gumbel noise -log(-log u) (the uniform from the RNG's integer bits, log, negate, log: 4), add it
  to the logit (1), divide by the temperature (1), the second softmax (5), accumulate into the score (1): 12.
  The RNG's integer mixing is not floating-point work.
- h2o: the model's own softmax is the score; each probability is added into its KV head's accumulated
  score (the GQA group sum and the accumulation are one add per element): 1.
- snapkv: the observation window's probabilities are summed into one vote per prompt key: 1 (the pooling
  along the sequence is counted separately, per pooled element).
- tova: the current query's probabilities are averaged over the layer's heads: 1.
- mass, pyramidkv, adakv: H2O's score (each probability added into its KV head's accumulated score): 1. Their
  selection (mass: a sort and prefix sum per head; adakv: a top-k over the layer's heads) is counted as
  selection, not score work.
"""
SCORE_FLOPS_PER_ELEMENT: dict[str, int] = {"keyformer": 12, "h2o": 1, "snapkv": 1, "tova": 1,
                                          "mass": 1, "pyramidkv": 1, "adakv": 1}
