"""`vllm-v0`: vLLM's V0 engine (releases before 0.8): the `vllm` profile's fitted kernel terms with the V0
engine's host work per step and per running sequence on the critical path (sim/profiles/engines.py)."""
from __future__ import annotations

from sim.profiles.engines import register_engine

PROFILE = register_engine("vllm", name="vllm-v0", runtime="vllm-v0")
