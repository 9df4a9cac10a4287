"""`python -m traces.gpu.timing_stage TIMING-ARGS`: `python -m traces.timing` for one model, plus what a GPU
run of GPT-J-6B / MPT-7B shapes needs and traces.timing does not do yet (reported to its owners; each
addition below steps aside once the timing code does the same itself):

1. the random-weight model is *built on the device*: traces.timing.build_model is called inside a
   `torch.device(device)` context, so the weights are allocated and initialised on the GPU (milliseconds)
   instead of a multi-GB default initialisation on the CPU followed by a copy;
2. the synthetic KV state draws its random K/V *on the device*: keyformer.generate.synthetic_state draws
   them with a CPU generator in fp32 (GPT-J at batch 8 and 4096 tokens is 7.5e9 normals, minutes on one
   CPU thread); while it runs, its `torch.randn` calls that use a CPU generator are served by a device
   generator instead (only the values differ, and timing does not depend on them);
3. *peak GPU memory* per point (`torch.cuda.max_memory_allocated` after a reset before the point) goes to
   `memory.csv` beside timing.parquet, unless the timing table has a `peak_mem_bytes` column of its own;
4. `--threads` defaults to torch's own thread count, the setting `hwmodels.calibrate` runs (and records)
   with, so sim.validate does not compare a 1-thread run with a calibration at another thread count.

Everything else (grid, medians, CUDA synchronisation, atomic trace-style folder, resume) is traces.timing's.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # before torch loads, as traces.timing does

import argparse
import functools
import sys
from pathlib import Path

import pandas as pd

MEMORY_FILE = "memory.csv"
MEMORY_COLUMNS = ("phase", "policy", "cache_ratio", "batch", "context", "peak_mem_bytes", "start_mem_bytes")


class TorchWithDeviceRandn:
    """Stands in for the `torch` module inside synthetic_state: `randn` calls drawn from a CPU generator
    (and given no device) are drawn on `device` from a device generator instead; everything else is torch."""

    def __init__(self, torch_module, device, seed: int):
        self._torch = torch_module
        self._device = device
        self._generator = torch_module.Generator(device=device).manual_seed(seed)

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def randn(self, *size, generator=None, **kwargs):
        on_cpu = generator is None or generator.device.type == "cpu"
        if on_cpu and kwargs.get("device") is None:
            kwargs["device"] = self._device
            generator = self._generator
        return self._torch.randn(*size, generator=generator, **kwargs)


def synthetic_state_on_device(original, device_types=("cuda",)):
    """Wrap keyformer.generate.synthetic_state so its random K/V are drawn on the model's device when that
    device's type is in `device_types` (tests pass ("cpu",) to exercise the wrapper without a GPU)."""
    module = sys.modules[original.__module__]

    @functools.wraps(original)
    def build(model, policy, batch, context_len, seed=0, max_new_tokens=128):
        import torch

        device = next(model.parameters()).device
        if device.type not in device_types:
            return original(model, policy, batch, context_len, seed=seed, max_new_tokens=max_new_tokens)
        saved = module.torch
        module.torch = TorchWithDeviceRandn(torch, device, seed)
        try:
            return original(model, policy, batch, context_len, seed=seed, max_new_tokens=max_new_tokens)
        finally:
            module.torch = saved

    build.draws_on_device = True
    return build


def build_on_device(original):
    """Wrap traces.timing.build_model so the model is allocated and initialised on its target device."""
    @functools.wraps(original)
    def build(config, dtype, device, seed):
        import torch
        with torch.device(device):
            return original(config, dtype, device, seed)
    return build


class MemoryLog:
    """memory.csv of one timing folder: one row per point, rewritten atomically after each point."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / MEMORY_FILE
        self.rows = pd.read_csv(self.path).to_dict("records") if self.path.exists() else []

    def add(self, row: dict) -> None:
        key = _key(row)
        self.rows = [r for r in self.rows if _key(r) != key] + [row]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        pd.DataFrame(self.rows, columns=list(MEMORY_COLUMNS)).to_csv(tmp, index=False)
        os.replace(tmp, self.path)


def _key(row) -> tuple:
    return (row["phase"], row["policy"], round(float(row["cache_ratio"]), 6), int(row["batch"]), int(row["context"]))


def with_peak_memory(time_fn, phase: str, log: MemoryLog):
    """Wrap traces.timing.time_decode / time_prefill: reset the CUDA peak before the point, log it after."""
    @functools.wraps(time_fn)
    def timed(model, *args):
        import torch

        grid = args[-1]
        if phase == "decode":
            point, batch, context = args[0], args[1], args[2]
            key = {"phase": "decode", "policy": point.name, "cache_ratio": point.ratio, "batch": int(batch),
                   "context": int(context)}
        else:
            key = {"phase": "prefill", "policy": "full", "cache_ratio": 1.0, "batch": 1, "context": int(args[0])}
        cuda = str(grid.device).startswith("cuda")
        if cuda:
            torch.cuda.synchronize(grid.device)
            torch.cuda.reset_peak_memory_stats(grid.device)
            start = torch.cuda.memory_allocated(grid.device)
        result = time_fn(model, *args)
        peak = torch.cuda.max_memory_allocated(grid.device) if cuda else -1
        log.add(key | {"peak_mem_bytes": int(peak), "start_mem_bytes": int(start) if cuda else -1})
        return result
    return timed


def _own_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int)
    args, _ = parser.parse_known_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = _own_args(argv)
    if len(own.model) != 1 or own.out is None:
        print("error: traces.gpu.timing_stage times exactly one --model into an --out folder", file=sys.stderr)
        return 2
    import torch

    import keyformer.generate
    from traces import timing

    if own.threads is None:
        argv += ["--threads", str(torch.get_num_threads())]
    timing.build_model = build_on_device(timing.build_model)
    if not getattr(keyformer.generate.synthetic_state, "draws_on_device", False):
        keyformer.generate.synthetic_state = synthetic_state_on_device(keyformer.generate.synthetic_state)
    if "peak_mem_bytes" not in timing.TIMING_COLUMNS:
        try:
            name, _ = timing.resolve_config(own.model[0])
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        log = MemoryLog(own.out / name)
        timing.time_decode = with_peak_memory(timing.time_decode, "decode", log)
        timing.time_prefill = with_peak_memory(timing.time_prefill, "prefill", log)
    return timing.main(argv)


if __name__ == "__main__":
    sys.exit(main())
