"""`trtllm-pytorch`: TensorRT-LLM's PyTorch backend (the 1.0 runtime, trtllm-bench's default): the `trtllm`
profile's fitted terms (sim/engine_profiles/gpu-published-fit.yaml) with decode steps replayed from CUDA
graphs (a kernel pays the GPU-side gap, not a host launch) and the overlap scheduler hiding the per-step
host work (sim/profiles/engines.py pytorch_runtime)."""
from __future__ import annotations

from sim.profiles import trtllm as _trtllm  # noqa: F401  (registers the base profile first)
from sim.profiles.engines import register_pytorch_runtime

PROFILE = register_pytorch_runtime()
