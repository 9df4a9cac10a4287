"""`python -m traces.gpu.timing_stage TIMING-ARGS`: `python -m traces.timing` for one model, with two
additions a GPU run of GPT-J-6B / MPT-7B shapes needs (everything else, including building the model on the
device, CUDA-synchronised medians, peak memory per point and the atomic resumable folder, is traces.timing's):

1. the synthetic KV state draws its random K/V *on the device, in the model's dtype*:
   keyformer.generate.synthetic_state draws them with a CPU generator in fp32 and copies them over. GPT-J at
   batch 8 and 4096 tokens is 7.5e9 normals: about 2 minutes on one CPU thread (55 M/s measured on the
   development machine) for one point, ~10 minutes for the issue-8 grid. While synthetic_state runs, its
   `torch.randn` calls that use a CPU generator and name no device are served by a device generator
   instead. Only the random values change (timing does not depend on them); the kept positions and scores
   are drawn as before. Once synthetic_state draws on the device itself, the stand-in passes every call
   through unchanged.
2. `--threads` defaults to torch's own thread count, the setting `hwmodels.calibrate` runs (and records)
   with, so sim.validate does not compare a 1-thread run with a calibration at another thread count.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # before torch loads, as traces.timing does

import functools
import sys


class TorchWithDeviceRandn:
    """Stands in for the `torch` module inside synthetic_state: `randn` calls drawn from a CPU generator that
    name no device are drawn on `device`, in `dtype`, from a device generator; everything else is torch."""

    def __init__(self, torch_module, device, dtype, seed: int):
        self._torch = torch_module
        self._device, self._dtype = device, dtype
        self._generator = torch_module.Generator(device=device).manual_seed(seed)

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def randn(self, *size, generator=None, **kwargs):
        on_cpu = generator is None or generator.device.type == "cpu"
        if on_cpu and kwargs.get("device") is None:
            kwargs["device"] = self._device
            kwargs.setdefault("dtype", self._dtype)   # no fp32 temporaries: the caller's .to() is then a no-op
            generator = self._generator
        return self._torch.randn(*size, generator=generator, **kwargs)


def synthetic_state_on_device(original, device_types=("cuda",)):
    """Wrap keyformer.generate.synthetic_state so its random K/V are drawn on the model's device when that
    device's type is in `device_types` (tests pass ("cpu",) to exercise the wrapper without a GPU)."""
    module = sys.modules[original.__module__]

    @functools.wraps(original)
    def build(model, policy, batch, context_len, seed=0, max_new_tokens=128):
        import torch

        param = next(model.parameters())
        if param.device.type not in device_types:
            return original(model, policy, batch, context_len, seed=seed, max_new_tokens=max_new_tokens)
        saved = module.torch
        module.torch = TorchWithDeviceRandn(torch, param.device, param.dtype, seed)
        try:
            return original(model, policy, batch, context_len, seed=seed, max_new_tokens=max_new_tokens)
        finally:
            module.torch = saved

    build.draws_on_device = True
    return build


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    import torch

    import keyformer.generate
    from traces import timing

    if not any(a == "--threads" or a.startswith("--threads=") for a in argv):
        argv += ["--threads", str(torch.get_num_threads())]
    if not getattr(keyformer.generate.synthetic_state, "draws_on_device", False):
        keyformer.generate.synthetic_state = synthetic_state_on_device(keyformer.generate.synthetic_state)
    if hasattr(timing, "synthetic_state"):   # in case traces.timing imports it at module level one day
        timing.synthetic_state = keyformer.generate.synthetic_state
    return timing.main(argv)


if __name__ == "__main__":
    sys.exit(main())
