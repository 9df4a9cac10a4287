"""Step times of a tp x pp deployment for the DES (the `decode`/`prefill`/`mixed` step-timer protocol of
sim.des): one device's share timed by sim.engine on the sharded model, plus the collectives over the
interconnect and the pipeline schedule of sim.parallel (module docstring of sim/parallel/__init__.py).

A step of the DES advances every running request by one token (or one prefill chunk). With pp stages the
running requests are split into M = min(requests, pp) micro-batches (prefill chunks ride with the first);
the step takes max(M, pp) stage steps of the slowest micro-batch, the host overhead once.
"""
from __future__ import annotations

import numpy as np

from hwmodels.platform import load_interconnect
from sim import engine
from sim.models import load_model

from .collectives import collectives
from .shard import check_degrees, shard_model


class ParallelTimer:
    def __init__(self, hw, model, *, tp: int = 1, pp: int = 1, policy: str, cache_ratio: float, recent_ratio: float,
                 weight_dtype: str, kv_dtype: str, profile: str, beams: int = 1):
        check_degrees(tp, pp)
        self.hw, self.full, self.tp, self.pp, self.beams = engine.resolve_device(hw), load_model(model), tp, pp, beams
        self.stage = shard_model(self.full, tp, pp)
        self.link = load_interconnect(self.hw)
        if self.link is None and tp * pp > 1:
            raise ValueError(f"device {self.hw.name} has no interconnect data: tp/pp > 1 cannot be timed")
        common = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, policy=policy, profile=profile)
        self._decode_kw = dict(common, recent_ratio=recent_ratio)
        self._prefill_kw = dict(common, cache_ratio=cache_ratio, recent_ratio=recent_ratio)
        self.setup = engine.make_setup(self.hw, self.stage, policy, weight_dtype, kv_dtype, profile)

    @property
    def model(self):
        """The per-device model (what the DES sizes the KV pool of one device by)."""
        return self.stage

    def _stage(self, kv, chunks) -> float:
        if len(kv) and chunks:
            return engine.mixed_step_time(self.hw, self.stage, kv, chunks, **self._prefill_kw)
        if chunks:
            return engine.prefill_time(self.hw, self.stage, chunks, **self._prefill_kw)
        return engine.decode_step_time(self.hw, self.stage, kv, **self._decode_kw)

    def _comm(self, rows: int, chunks) -> float:
        if self.tp * self.pp == 1:
            return 0.0
        tokens = rows * self.beams + sum(c[0] for c in chunks) * self.beams
        logits = rows * self.beams + len(chunks) * self.beams
        colls = collectives(self.full, self.stage, tokens, self.tp, self.pp, self.link, self.setup.ab,
                            self.setup.launch_s, logits)
        return float(sum(float(c.time_s) for c in colls))

    def _step(self, kv, chunks) -> float:
        kv = np.asarray(kv, float)
        chunks = list(chunks or [])
        if self.tp == 1 and self.pp == 1:
            return self._stage(kv, chunks)
        m = max(1, min(len(kv) + (1 if chunks and not len(kv) else 0), self.pp))
        groups = np.array_split(kv, m) if len(kv) else [kv]
        host = self.setup.host_s
        slowest = max(self._stage(g, chunks if i == 0 else []) - host + self._comm(len(g), chunks if i == 0 else [])
                      for i, g in enumerate(groups) if len(g) or (i == 0 and chunks))
        return max(m, self.pp) * slowest + host

    def decode(self, kv: np.ndarray) -> float:
        return self._step(kv, [])

    def prefill(self, chunks) -> float:
        return self._step(np.zeros(0), chunks)

    def mixed(self, kv: np.ndarray, chunks) -> float:
        return self._step(kv, chunks)
