"""hwmodels.calibrate: measure the local device and write a hardware file of the same schema.

    python -m hwmodels.calibrate --device cpu|cuda [--out FILE] [--quick]

Microbenchmarks only (never model runs): read and copy bandwidth over sizes, GEMV and GEMM
throughput over sizes and dtypes, per-op dispatch overhead, per-step decode-loop host work.
The CPU and CUDA paths share everything except the timer (wall clock vs CUDA events) and the
plan (sizes, dtypes): see plan.py, bench.py, fit.py, document.py.

Only bench.py imports torch, and only once the CLI has put OMP_WAIT_POLICY in the
environment (OpenMP reads it when torch loads).
"""
