"""Capturing traces: run a real model under KV policies over real inputs and write a trace folder.

    from traces.capture import CaptureConfig, run_capture
    run_capture(CaptureConfig(model="stories260k", policies=["full", "h2o"], dataset="tinystories",
                              n=4, max_new_tokens=16, out="/tmp/t"))

CLI: `python -m traces.capture --help`. torch is imported only once a capture starts, so the CLI can set
OMP_WAIT_POLICY first (it must be set before OpenMP starts to matter).
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kvcommon.cli import parse_part, progress_disabled
from kvcommon.design import CACHE_RATIO_RANGE, RECENT_RATIO_RANGE
from kvcommon.fields import FieldError, at_least, param, validate
from traces import schema
from traces.datasets import DATASETS, dataset_info, load_samples

DEFAULT_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def _part_problem(text: str) -> str | None:
    try:
        parse_part(text)
    except ValueError:
        return "must be K/N with 1 <= K <= N (e.g. 1/2)"
    return None


def _device_problem(device: str) -> str | None:
    return None if device in ("cpu", "cuda") or device.startswith("cuda:") else "must be cpu or cuda"


@dataclass
class CaptureConfig:
    """One capture, each parameter declared once: its help, check and flag (kvcommon.fields) feed both
    this check and `python -m traces.capture`'s flags; errors name the field (`n must be >= 1, got 0`)."""
    model: str = param(help="model folder, HF id, or smollm2-135m | gemma3-270m | stories260k | tiny-llama | tiny-gpt2")
    # policy specs: "h2o", "keyformer:noise=gaussian" (strings) or PolicySpec; the CLI's --policy is its own
    policies: list = param(help="policy variants")
    dataset: str = param(help=f"{', '.join(DATASETS)}, long-text:NAME or jsonl:PATH")
    out: Path = param(help="trace folder to write (resumed if it holds the same capture)")
    n: int = param(8, help="number of samples (default 8)", check=at_least(1))
    max_new_tokens: int = param(32, help="tokens generated or forced (default 32)", check=at_least(1))
    cache_ratios: tuple[float, ...] = param(DEFAULT_RATIOS, list=True, check=CACHE_RATIO_RANGE,
                                            help="kept fraction of the prompt (default 0.1,...,1.0; full uses 1.0 only)")
    recent_ratio: float | None = param(None, check=RECENT_RATIO_RANGE,   # None: each policy's own default
                                       help="recent-window share of the budget for h2o/keyformer (default: the policy's own)")
    device: str = param("cpu", help="cpu or cuda (default cpu)", check=_device_problem)
    dtype: str = param("fp32", help="fp32, bf16 or fp16 (default fp32)", choices=("fp32", "bf16", "fp16"))
    seed: int = param(0, help="random seed (samples, Keyformer's noise)", check=at_least(0))
    max_prompt_tokens: int | None = param(None, help="cut longer documents to fit", check=at_least(2))
    # None: the dataset's mode (long-text is teacher-forced)
    teacher_forced: bool | None = param(None, help="force the reference tokens instead of generating (perplexity, "
                                                   "top-1 agreement); the default for long-text")
    # torch CPU threads (None: torch's default); recorded in the manifest
    threads: int | None = param(None, help="torch CPU threads (default: torch's choice)", check=at_least(1))
    # "summary": per-step kv rows (means over layers and heads), no kept positions
    detail: str = param("full", choices=("full", "summary"),
                        help="full: kv rows per layer and KV head plus kept positions; summary: one kv row per step "
                             "(means over layers and heads), no kept positions, for large quality runs (default full)")
    shared_prefill: bool = True  # one recorded prompt forward per sample, replayed for every run on it
    # samples decoded together (left-padded); >1 is several times faster on CPU
    batch_size: int = param(1, check=at_least(1),
                            help="samples decoded together, left-padded (default 1). Larger batches run several "
                                 "times faster on CPU; Keyformer's noise is then drawn per batch")
    # chunk size of long-text samples (half prompt, half forced continuation)
    long_text_chars: int = param(6000, check=at_least(200),
                                 help="characters per long-text chunk: the first half is the prompt (default 6000)")
    overwrite: bool = param(False, help="discard what --out holds and start over")
    # one worker's share: batch i is this worker's when i % N == K - 1, so the batches (and every result)
    # are those of a single worker; not a setting of the capture (a resume may use any split)
    part: str = param("1/1", metavar="K/N", check=_part_problem,
                      help="capture only every N-th batch of samples, starting at the K-th: run K = 1..N at once "
                           "on one --out, one per core (default 1/1); the part that finds every run done "
                           "writes the trace")
    progress: bool = True
    specs: list = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from traces.capture.spec import PolicySpec

        self.out = Path(self.out).expanduser()
        if not self.policies:
            raise ValueError("give at least one --policy")
        self.specs = [p if isinstance(p, PolicySpec) else PolicySpec.read(p) for p in self.policies]   # either spelling
        labels = [s.label for s in self.specs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"policy given twice: {', '.join(labels)}")
        self.cache_ratios = tuple(float(r) for r in self.cache_ratios)
        if not self.cache_ratios:
            raise FieldError("cache_ratios", "must hold at least one ratio", [])
        validate(self)
        if len(set(self.cache_ratios)) != len(self.cache_ratios):
            raise ValueError("a cache ratio is given twice")
        dataset_info(self.dataset)  # unknown names fail here, before any model loads
        if self.overwrite and self.part != "1/1":
            raise ValueError("--overwrite with --part: the other parts would lose their runs; start over with "
                             "--part 1/1 or delete --out first")

    def ratios_for(self, spec) -> tuple:
        """The full cache has one setting: it is captured at ratio 1.0 only."""
        return (1.0,) if spec.name == "full" else self.cache_ratios

    def settings(self, sample_ids: list[str]) -> dict:
        """What identifies this capture (a resume must match it exactly)."""
        return {"model": self.model, "policies": [s.label for s in self.specs],
                "cache_ratios": list(self.cache_ratios), "recent_ratio": self.recent_ratio,
                "dataset": self.dataset, "n": self.n, "sample_ids": sample_ids,
                "max_new_tokens": self.max_new_tokens, "device": self.device, "dtype": self.dtype,
                "seed": self.seed, "max_prompt_tokens": self.max_prompt_tokens, "mode": self.mode(),
                "detail": self.detail, "batch_size": self.batch_size,
                **({"long_text_chars": self.long_text_chars} if self.dataset.startswith("long-text") else {})}

    def mode(self) -> str:
        if self.teacher_forced is None:
            return dataset_info(self.dataset).mode
        return "teacher_forced" if self.teacher_forced else "generate"


def _versions() -> dict:
    import numpy
    import pandas
    import pyarrow
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": numpy.__version__,
            "pandas": pandas.__version__, "pyarrow": pyarrow.__version__}


def _environment(device) -> dict:
    import torch

    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"), "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES"),
           "torch_threads": torch.get_num_threads(),
           "cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def run_capture(config: CaptureConfig) -> Path:
    """Capture every (sample, policy, ratio) not already on disk, then consolidate. Returns the folder."""
    import torch
    from tqdm import tqdm

    from traces.capture import store
    from traces.capture.prompts import check_positions, forced_ids, prompt_ids
    from traces.capture.run import capture_batch, make_policy
    from traces.models import load_model

    info = dataset_info(config.dataset)
    for spec in config.specs:  # bad policy names/parameters fail before the data and the model load
        for ratio in config.ratios_for(spec):
            make_policy(spec, ratio, config.recent_ratio, config.max_new_tokens, config.seed)
    samples = load_samples(config.dataset, config.n, config.seed, long_text_chars=config.long_text_chars)
    if len(samples) < config.n:
        print(f"note: dataset {config.dataset} has only {len(samples)} samples (asked for {config.n})",
              file=sys.stderr)
    out = config.out
    settings = config.settings([s.id for s in samples])
    # a finished capture, or one with other settings, is known from the folder alone: before the model loads
    if not config.overwrite and store.check_resume(out, settings) and not (out / store.CAPTURE_CONFIG).exists():
        print(f"{out}: already complete", file=sys.stderr)
        return out
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if progress_disabled(config.progress):    # transformers' own "Loading weights" bar too
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    lm = load_model(config.model, device=config.device, dtype=config.dtype)
    # Every prompt is built before the first run, so a sample that cannot fit fails now, not an hour in.
    prompts = {s.id: prompt_ids(lm, s, info, config.max_prompt_tokens) for s in samples}
    check_positions(lm, prompts, config.max_new_tokens)
    teacher_forced = config.mode() == "teacher_forced"
    forced = {s.id: forced_ids(lm, s, config.max_new_tokens) for s in samples} if teacher_forced else {}
    # --out is created only now that the model, the device and every sample's length are known to work
    if config.overwrite and out.exists():
        for name in (schema.MANIFEST, schema.KV, schema.KEPT, schema.STEPS, schema.TEXTS, store.CAPTURE_CONFIG):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / store.SHARDS, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    store.write_json(out / store.CAPTURE_CONFIG, settings)

    torch.manual_seed(config.seed)
    if config.threads is not None:
        torch.set_num_threads(config.threads)

    size = config.batch_size
    part, parts = parse_part(config.part)
    mine = [first for first in range(0, len(samples), size) if (first // size) % parts == part - 1]
    keys_of = lambda group: [store.shard_key(spec.label, ratio, sample.id) for sample in group
                             for spec in config.specs for ratio in config.ratios_for(spec)]
    keys = keys_of(samples)
    my_keys = [key for first in mine for key in keys_of(samples[first:first + size])]
    done = sum(store.shard_done(out, key) for key in my_keys)
    bar = tqdm(total=len(my_keys), initial=done, desc=f"capture {lm.name}" + (f" {config.part}" if parts > 1 else ""),
               unit="run", disable=progress_disabled(config.progress), file=sys.stderr, dynamic_ncols=True)
    for first in mine:
        group = samples[first:first + size]  # decoded together; shadows and the prompt record are theirs
        memos = [{} for _ in group]
        record = None
        for spec in config.specs:
            for ratio in config.ratios_for(spec):
                group_keys = [store.shard_key(spec.label, ratio, sample.id) for sample in group]
                pending = sum(not store.shard_done(out, key) for key in group_keys)
                if not pending:
                    continue
                if record is None and config.shared_prefill:
                    from keyformer.generate import record_prefill
                    from traces.capture.run import padded_batch

                    record = record_prefill(lm.model, *padded_batch([prompts[s.id] for s in group],
                                                                     lm.tokenizer, device))
                bar.set_postfix_str(f"{group[0].id}{'+' + str(len(group) - 1) if len(group) > 1 else ''} "
                                    f"{spec.label} r={ratio:g}")
                started = time.perf_counter()
                results = capture_batch(
                    lm, spec, ratio, config.recent_ratio, [prompts[s.id] for s in group],
                    [forced[s.id] for s in group] if teacher_forced else None, config.max_new_tokens,
                    config.seed, [s.id for s in group], [s.reference for s in group], memos, record,
                    config.detail)
                wall = (time.perf_counter() - started) / len(group)
                for key, result in zip(group_keys, results):
                    result.text["run_wall_s"] = wall
                    store.write_shard(out, key, result)  # a resumed batch rewrites the same shards
                bar.update(pending)
        del record
    bar.close()
    missing = sum(not store.shard_done(out, key) for key in keys)
    if missing:     # other parts still running: the last to finish writes the trace
        print(f"{out}: part {config.part} done; {missing} runs of other parts still missing, no trace yet",
              file=sys.stderr)
        return out

    wall = sum(json.loads((out / store.SHARDS / k / "text.json").read_text()).get("run_wall_s", 0.0) for k in keys)
    manifest = _manifest(config, lm, info, samples, prompts, wall, device, settings)
    store.consolidate(out, keys, manifest)
    return out


def _manifest(config: CaptureConfig, lm, info, samples, prompts, wall: float, device, settings: dict) -> dict:
    from traces.capture.prompts import prompt_format
    from traces.capture.run import make_policy, rules_metadata

    variants = {}
    for spec in config.specs:
        policy = make_policy(spec, config.ratios_for(spec)[0], config.recent_ratio, config.max_new_tokens,
                             config.seed)
        params = policy.params()
        params.pop("cache_ratio", None)  # a column of the tables, not a property of the variant
        rules = rules_metadata(policy)  # the rules the label ran under (docs/traces.md, "Rule versions")
        variants[spec.label] = {"name": spec.name, "params": params, "rules": rules}
    return {
        "schema_version": schema.SCHEMA_VERSION, "kind": schema.KIND,
        "model": lm.describe(),
        "policy": {"names": [s.label for s in config.specs], "variants": variants,
                   "cache_ratios": list(config.cache_ratios), "recent_ratio": config.recent_ratio,
                   "rules_version": rules["rules_version"]},
        "dataset": {"name": config.dataset, "task": info.task, "mode": config.mode(), "source": info.source,
                    "n": len(samples), "sample_ids": [s.id for s in samples],
                    "max_prompt_tokens": config.max_prompt_tokens,
                    "prompt_format": sorted({prompt_format(lm, s) for s in samples}),
                    "prompt_lens": {s.id: len(prompts[s.id]) for s in samples}},
        "max_new_tokens": config.max_new_tokens,
        "device": config.device, "dtype": config.dtype, "versions": _versions(), "seed": config.seed,
        "wall_time_s": round(wall, 3), "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "detail": config.detail, "shared_prefill": config.shared_prefill,
        "env": _environment(device), "capture": settings,
    }
