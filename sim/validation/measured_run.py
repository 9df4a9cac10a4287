"""Users' own benchmark outputs as measured runs: one `MeasuredRun` record from each run a file holds.

Three tools, read by their own field names and units (taken from the tools' sources; the fixtures under
tests/sim/data/measured_runs/ are written by hand to those names):

- vLLM `vllm bench serve --save-result` (and the older benchmarks/benchmark_serving.py): one JSON object.
  Setup keys `date`, `backend`, `model_id`, `tokenizer_id`, `num_prompts`, `request_rate` (a number or
  "inf"), `burstiness` (the gamma shape of the gaps; 1 = Poisson), `max_concurrency` (null: no limit);
  results `duration` (s), `completed`, `total_input_tokens`, `total_output_tokens`, `request_throughput`
  (req/s), `output_throughput` (tok/s), `{mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms` (milliseconds);
  per request `input_lens`, `output_lens`, `ttfts` (seconds), `itls` (lists of seconds), `errors`
  ("" when the request succeeded), `generated_texts`.
- SGLang `python -m sglang.bench_serving --output-file F.jsonl`: one JSON object per line, one line per
  run (a rate sweep appends lines). Keys `backend`, `dataset_name`, `request_rate`, `max_concurrency`,
  `sharegpt_output_len`, `random_input_len`, `random_output_len`, `random_range_ratio`, `duration` (s),
  `completed`, `total_input_tokens`, `total_output_tokens`, `request_throughput`, `input_throughput`,
  `output_throughput`, `{mean,median,std,p99}_{ttft,tpot,itl}_ms`, `mean_e2e_latency_ms`,
  `median_e2e_latency_ms`, `concurrency`; with `--output-details` also `input_lens`, `output_lens`,
  `ttfts`, `itls` as vLLM writes them. The file does not name the model: `--model`.
- TensorRT-LLM `trtllm-bench ... --report_json F.json`: one object with sections `engine` (`model`,
  `backend`, `dtype`, `version`), `world_info` (`tp_size`, `pp_size`, `max_batch_size`, `issue_rate`),
  `request_info` (`num_requests`, `avg_num_concurrent_requests`, `avg_input_length`,
  `avg_output_length`), `performance` (`total_latency_ms`, `avg_request_latency_ms`,
  `request_throughput_req_s`, `system_output_throughput_tok_s`, `output_throughput_per_user_tok_s`,
  `request_latency_percentiles_ms`), `streaming_metrics` when streamed (`avg_ttft_ms`, `avg_tpot_ms`,
  `ttft_percentiles`, `tpot_percentiles`: keys `average`, `p50`, `p90`, `p95`, `p99`, `minimum`,
  `maximum`, in ms) and `dataset` (`avg_isl`, `avg_osl`, `max_isl`, `max_osl`, `num_requests`). It
  keeps no per-request lengths: the replay uses the averages.

Every metric is stored in seconds (or per second) under kvsim's names (`ttft_s_mean`, `ttft_s_p50`,
`ttft_s_p99`, `tpot_s_*`, `itl_s_*`, `e2e_s_*`, `requests_per_s`, `tokens_per_s`). A file that is none of
these is a ValueError naming what was expected. None of them names the accelerator: `--hw`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TOOLS = ("vllm", "sglang", "trtllm")
EXPECTED = ("a vLLM `bench serve --save-result` JSON (keys model_id, request_rate, duration, p99_ttft_ms, ...), "
            "an SGLang `bench_serving` JSONL (keys backend, dataset_name, request_rate, duration, ...) or a "
            "TensorRT-LLM `trtllm-bench --report_json` report (sections engine, world_info, performance)")
# (kvsim name, tool key stem) for the millisecond summaries vLLM and SGLang write as {stat}_{stem}_ms
_STATS = (("mean", "mean"), ("p50", "median"), ("p99", "p99"))
_VLLM_STEMS = (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("itl_s", "itl"), ("e2e_s", "e2el"))
_SGLANG_STEMS = (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("itl_s", "itl"), ("e2e_s", "e2e_latency"))
_TRT_PERCENTILES = (("mean", "average"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"))


@dataclass
class MeasuredRun:
    """One benchmark run as kvsim reads it: what was served, how it arrived, what was measured."""

    tool: str                          # vllm | sglang | trtllm
    source: str                        # file (and line for JSONL)
    engine: str                        # the backend the tool names (vllm, sglang, TRT, Pytorch, ...)
    model: str | None                  # as the file names it (a Hugging Face id, a path), None when it does not
    requests: int                      # completed requests
    request_rate: float                # req/s the client aimed at (inf: all at once)
    burstiness: float = 1.0            # gamma shape of the gaps (1: Poisson)
    max_concurrency: int | None = None  # the client's limit on requests in flight
    tp: int = 1
    pp: int = 1
    prompt_lens: np.ndarray | None = None   # per request, when the file keeps them
    output_lens: np.ndarray | None = None
    mean_prompt: float | None = None
    mean_output: float | None = None
    duration_s: float | None = None
    metrics: dict = field(default_factory=dict)   # kvsim name -> measured value (seconds, req/s, tok/s)
    notes: list = field(default_factory=list)     # what the reader assumed

    @property
    def per_request(self) -> bool:
        return self.prompt_lens is not None and self.output_lens is not None

    def describe(self) -> str:
        rate = "all at once" if math.isinf(self.request_rate) else f"{self.request_rate:g} req/s"
        limit = f", at most {self.max_concurrency} in flight" if self.max_concurrency else ""
        return (f"{self.tool} ({self.engine}) {self.model or '?'}: {self.requests} requests, {rate}{limit}, "
                f"tp {self.tp}")


def _number(value, what: str, source: str) -> float:
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{source}: {what} must be a number, got {value!r}")
    return float(value)


def _ms_metrics(data: dict, stems) -> dict:
    out = {}
    for name, stem in stems:
        for stat, key in _STATS:
            value = data.get(f"{key}_{stem}_ms")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out[f"{name}_{stat}"] = float(value) / 1e3
    return out


def _throughputs(data: dict, out: dict) -> dict:
    for name, key in (("requests_per_s", "request_throughput"), ("tokens_per_s", "output_throughput")):
        if isinstance(data.get(key), (int, float)):
            out[name] = float(data[key])
    return out


def _per_request(data: dict, source: str):
    """input_lens / output_lens of the successful requests (errors "" and output > 0), or (None, None)."""
    ins, outs = data.get("input_lens"), data.get("output_lens")
    if not isinstance(ins, list) or not isinstance(outs, list) or not ins:
        return None, None
    if len(ins) != len(outs):
        raise ValueError(f"{source}: input_lens has {len(ins)} entries but output_lens {len(outs)}")
    errors = data.get("errors") if isinstance(data.get("errors"), list) else [""] * len(ins)
    try:
        ins, outs = np.asarray(ins, dtype=float), np.asarray(outs, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: input_lens / output_lens must be lists of token counts") from None
    ok = np.array([not e for e in errors[:len(ins)]] + [True] * max(len(ins) - len(errors), 0)) & (outs > 0)
    if np.any(ins[ok] < 1) or np.any(ins != np.round(ins)) or np.any(outs != np.round(outs)) or np.any(outs < 0):
        raise ValueError(f"{source}: input_lens / output_lens must be whole token counts >= 1")
    if not ok.any():
        raise ValueError(f"{source}: no successful request (every one has an error or no output)")
    return ins[ok].astype(np.int64), outs[ok].astype(np.int64)


def _common(tool: str, data: dict, source: str, stems) -> MeasuredRun:
    completed = data.get("completed")
    if isinstance(completed, bool) or not isinstance(completed, int) or completed < 1:
        raise ValueError(f"{source}: completed must be a whole number of requests >= 1, got {completed!r}")
    prompts, outputs = _per_request(data, source)
    concurrency = data.get("max_concurrency")
    run = MeasuredRun(
        tool=tool, source=source, engine=str(data.get("backend") or tool),
        model=data.get("model_id") if isinstance(data.get("model_id"), str) else None, requests=completed,
        request_rate=_number(data.get("request_rate", "inf"), "request_rate", source),
        burstiness=_number(data.get("burstiness", 1.0) or 1.0, "burstiness", source),
        max_concurrency=int(concurrency) if isinstance(concurrency, int) and concurrency > 0 else None,
        prompt_lens=prompts, output_lens=outputs,
        duration_s=float(data["duration"]) if isinstance(data.get("duration"), (int, float)) else None,
        metrics=_throughputs(data, _ms_metrics(data, stems)))
    totals = (data.get("total_input_tokens"), data.get("total_output_tokens"))
    if prompts is not None:
        run.mean_prompt, run.mean_output = float(prompts.mean()), float(outputs.mean())
    elif all(isinstance(t, (int, float)) for t in totals):
        run.mean_prompt, run.mean_output = totals[0] / completed, totals[1] / completed
        run.notes.append("no per-request lengths in the file: every request replays the mean prompt and output")
    else:
        raise ValueError(f"{source}: neither input_lens / output_lens nor total_input_tokens / total_output_tokens")
    return run


def read_vllm(data: dict, source: str) -> MeasuredRun:
    run = _common("vllm", data, source, _VLLM_STEMS)
    if not run.metrics:
        raise ValueError(f"{source}: a vLLM result without any *_ttft_ms / *_tpot_ms / request_throughput value")
    return run


def read_sglang(data: dict, source: str) -> MeasuredRun:
    if data.get("request_rate") == "trace":
        raise ValueError(f"{source}: request_rate 'trace' (SGLang replayed its own timestamps, which the file "
                         "does not keep): kvsim cannot replay the arrivals")
    run = _common("sglang", data, source, _SGLANG_STEMS)
    if not run.metrics:
        raise ValueError(f"{source}: an SGLang result without any *_ttft_ms / *_tpot_ms / request_throughput value")
    return run


def _section(data: dict, name: str, source: str) -> dict:
    value = data.get(name)
    if not isinstance(value, dict):
        raise ValueError(f"{source}: a trtllm-bench report needs a {name!r} section")
    return value


def read_trtllm(data: dict, source: str) -> MeasuredRun:
    engine, world = _section(data, "engine", source), _section(data, "world_info", source)
    perf, info = _section(data, "performance", source), _section(data, "request_info", source)
    dataset = data.get("dataset") if isinstance(data.get("dataset"), dict) else {}
    n = info.get("num_requests", dataset.get("num_requests"))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{source}: request_info.num_requests must be a whole number >= 1, got {n!r}")
    isl = info.get("avg_input_length", dataset.get("avg_isl"))
    osl = info.get("avg_output_length", dataset.get("avg_osl"))
    if not all(isinstance(v, (int, float)) and v >= 1 for v in (isl, osl)):
        raise ValueError(f"{source}: request_info.avg_input_length / avg_output_length must be numbers >= 1")
    metrics = {}
    for name, key in (("requests_per_s", "request_throughput_req_s"), ("tokens_per_s", "system_output_throughput_tok_s")):
        if isinstance(perf.get(key), (int, float)):
            metrics[name] = float(perf[key])
    latency = perf.get("request_latency_percentiles_ms") or {}
    streaming = data.get("streaming_metrics") if isinstance(data.get("streaming_metrics"), dict) else {}
    for name, table in (("e2e_s", latency), ("ttft_s", streaming.get("ttft_percentiles") or {}),
                        ("tpot_s", streaming.get("tpot_percentiles") or {})):
        for stat, key in _TRT_PERCENTILES:
            if isinstance(table.get(key), (int, float)):
                metrics[f"{name}_{stat}"] = float(table[key]) / 1e3
    concurrency = world.get("max_batch_size")
    issue = world.get("issue_rate")
    run = MeasuredRun(
        tool="trtllm", source=source, engine=f"trtllm-{str(engine.get('backend', 'TRT')).lower()}",
        model=engine.get("model") if isinstance(engine.get("model"), str) else None, requests=n,
        request_rate=math.inf, max_concurrency=int(concurrency) if isinstance(concurrency, int) and concurrency > 0
        else None, tp=int(world.get("tp_size") or 1), pp=int(world.get("pp_size") or 1),
        mean_prompt=float(isl), mean_output=float(osl),
        duration_s=float(perf["total_latency_ms"]) / 1e3 if isinstance(perf.get("total_latency_ms"), (int, float))
        else None, metrics=metrics)
    run.notes.append("trtllm-bench keeps no per-request lengths: every request replays the average input and "
                     "output length")
    run.notes.append(f"requests issued all at once (the report's issue_rate {issue!r} req/s is the client's send "
                     "rate, not a target), at most max_batch_size in flight")
    return run


def detect(data) -> str | None:
    """Which tool wrote this JSON object (None: none of them)."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("performance"), dict) and "request_throughput_req_s" in data["performance"] \
            and isinstance(data.get("engine"), dict):
        return "trtllm"
    if "model_id" in data and "tokenizer_id" in data and "duration" in data:
        return "vllm"
    if "backend" in data and "dataset_name" in data and "duration" in data and (
            "sharegpt_output_len" in data or "random_input_len" in data):
        return "sglang"
    return None


READERS = {"vllm": read_vllm, "sglang": read_sglang, "trtllm": read_trtllm}


def _objects(path: Path) -> list[tuple[object, str]]:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file; expected {EXPECTED}") from None
    if not text.strip():
        raise ValueError(f"{path}: empty; expected {EXPECTED}")
    try:
        return [(json.loads(text), str(path))]
    except json.JSONDecodeError:
        pass
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((json.loads(line), f"{path}:{lineno}"))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON ({exc.msg}); expected {EXPECTED}") from None
    return out


def load_measured_runs(path) -> list[MeasuredRun]:
    """Every run in a benchmark output file (a JSONL file may hold several); ValueError naming what a
    file that is none of them should have been."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"measured run {path} not found")
    runs = []
    for data, source in _objects(path):
        tool = detect(data)
        if tool is None:
            keys = ", ".join(list(data)[:6]) if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{source}: not a benchmark result kvsim reads (found {keys}); expected {EXPECTED}")
        runs.append(READERS[tool](data, source))
    return runs
