#!/usr/bin/env bash
# The one-command GPU run (issue 8); see workflows/gpu/README.md for the device-tool call.
# Uses the machine's own python3 (torch, transformers there) with the repository on PYTHONPATH: nothing is
# installed. Everything printed also goes to $OUT/run_all.log when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-ACTIVE}"
PY=${PYTHON:-python3}
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  "$PY" -m workflows.gpu.run_all "$@" 2>&1 | tee "$OUT/run_all.log"
  exit "${PIPESTATUS[0]}"
fi
exec "$PY" -m workflows.gpu.run_all "$@"
