import os

# Quiet, comparable CPU timings: torch's OpenMP threads otherwise sleep between small ops.
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
