"""Kernel-level decode-attention measurements (`../shared/data/gpu-attention-kernels.csv`: the FlashInfer
blog's Figures 6, 8 and 9, achieved fraction of peak HBM bandwidth by kernel, GQA group, batch and KV length)
as rows the engine fit predicts with the same decode-attention terms as the engines (sim/profiles/attention.py).

A row's kernel reads 2 x batch x kv_heads x kv_len x head_dim K/V elements of 2 bytes (fp16) and does
4 x batch x query_heads x kv_len x head_dim FLOPs; its utilisation is those bytes over its time, over the
blog's peak bandwidth (the row's notes: "blog peak 3352 GB/s"). The fp32 peak (CUDA-core rate) is the nearest
hardware file's (A100 PCIe: the A100 SXM file's 19.5 TFLOP/s, the same SMs and clocks for compute).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from hwmodels import load_device
from hwmodels.skus import resolve_sku
from sim.profiles import attention as attn
from sim.validation.published_rows import STACKS_FILE, data_dir, read_data_csv

CSV_NAME = "gpu-attention-kernels.csv"
COLUMNS = ("source", "hw", "kernel_impl", "attention_case", "num_qo_heads", "num_kv_heads", "head_dim", "batch",
           "kv_len_per_request", "kv_dtype", "metric", "value", "notes")
# A100 PCIe has no hardware file of its own: its CUDA-core fp32 rate is the SXM part's (same GA100, 1410 MHz)
FP32_STANDIN = {"A100-PCIe-80GB": "a100-80g-sxm"}


@dataclass(frozen=True)
class KernelRow:
    index: int
    source: str
    hw_label: str
    kernel: str
    family: str
    case: str
    query_heads: int
    kv_heads: int
    head_dim: int
    batch: int
    kv_len: int
    value: float            # % of peak bandwidth
    peak_bw: float          # bytes/s the utilisation is relative to
    fp32: float             # FLOP/s of the CUDA cores

    @property
    def group(self) -> float:
        return self.query_heads / self.kv_heads

    @property
    def kv_bytes(self) -> float:
        return 2.0 * self.batch * self.kv_heads * self.kv_len * self.head_dim * 2.0

    @property
    def flops(self) -> float:
        return 4.0 * self.batch * self.query_heads * self.kv_len * self.head_dim

    @property
    def id(self) -> str:
        return f"{self.source}/{self.hw_label}/{self.kernel}/g{self.group:g}/b{self.batch}x{self.kv_len}"


@lru_cache(maxsize=None)
def _impl_rules() -> tuple:
    data = yaml.safe_load(Path(STACKS_FILE).read_text())
    return tuple((re.compile(r["match"], re.IGNORECASE), r["family"]) for r in data["kernel_impls"])


def family_of(kernel: str) -> str | None:
    return next((family for pattern, family in _impl_rules() if pattern.search(kernel)), None)


def default_csv() -> Path:
    return data_dir() / CSV_NAME


def load_kernel_rows(path: Path | str | None = None) -> list[KernelRow]:
    """Every row of the kernel file; one-line errors naming the file and row."""
    path = Path(path) if path is not None else default_csv()
    table = read_data_csv(path, COLUMNS, "kernel measurements")
    rows = []
    for i, r in enumerate(table.to_dict("records"), start=1):
        where = f"{path.name} row {i}"
        family = family_of(r["kernel_impl"])
        if family is None:
            raise ValueError(f"{where}: kernel {r['kernel_impl']!r} has no family (sim/engine_profiles/stacks.yaml)")
        peak = re.search(r"peak\s+([0-9.]+)\s*GB/s", r["notes"])
        if peak is None:
            raise ValueError(f"{where}: notes name no peak bandwidth ('blog peak N GB/s')")
        device = FP32_STANDIN.get(r["hw"].strip()) or resolve_sku(r["hw"])[0]
        if device is None:
            raise ValueError(f"{where}: no hardware file for {r['hw']!r}")
        try:
            ints = [int(r[c]) for c in ("num_qo_heads", "num_kv_heads", "head_dim", "batch", "kv_len_per_request")]
            value = float(r["value"])
        except ValueError:
            raise ValueError(f"{where}: heads, head_dim, batch, kv_len and value must be numbers") from None
        rows.append(KernelRow(i, r["source"], r["hw"].strip(), r["kernel_impl"].strip(), family,
                              r["attention_case"].strip(), *ints, value=value, peak_bw=float(peak.group(1)) * 1e9,
                              fp32=float(load_device(device).peak_flops("fp32"))))
    return rows


def predict_kernel(row: KernelRow, values: dict) -> float:
    """Predicted % of peak bandwidth of the row's kernel under the engine terms `values`."""
    t = attn.kernel_time(row.family, row.group, row.kv_bytes, row.flops, row.peak_bw, row.fp32, values)
    return float(row.kv_bytes / t / row.peak_bw * 100.0)
