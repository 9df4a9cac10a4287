"""`vllm`: vLLM as the fused operators plus the engine terms fitted to published measurements
(sim/profiles/engines.py has the terms; the values are data, sim/engine_profiles/gpu-published-fit.yaml)."""
from __future__ import annotations

from sim.profiles.engines import register_engine

PROFILE = register_engine("vllm")
