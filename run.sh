#!/usr/bin/env bash
# kvsim quickstart: `bash run.sh sweep` runs the default design-space sweep,
# `bash run.sh test` runs the test suite. Each creates .venv and installs what it needs
# on first use; re-running is safe (installs are skipped while pyproject.toml is unchanged).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv

ensure_venv() {
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
}

# install EXTRAS STAMP: pip-install the project with the given extras once per pyproject change.
install() {
  local extras=$1 stamp="$VENV/.installed-$1"
  local want; want=$(sha256sum pyproject.toml | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  python -m pip install -q --upgrade pip
  if [[ "$extras" == *capture* ]]; then
    # Pinned first: an unpinned torch may pull a newer multi-GB CUDA build. From PyPI on Linux this pin is the
    # CUDA build too; README.md gives the CPU-only install (download.pytorch.org/whl/cpu) to run first.
    python -m pip install -q "torch==2.13.0"
  fi
  python -m pip install -q -e ".[$extras]"
  echo "$want" > "$stamp"
}

cmd=${1:-}
shift || true
case "$cmd" in
  sweep)
    ensure_venv; install test
    exec python -m sim.sweep "$@" ;;
  test)
    ensure_venv; install capture,scale,notebooks,test
    # Quiet, comparable CPU timings (see docs/ARCHITECTURE.md, "Measuring on CPU").
    export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-ACTIVE}
    exec python -m pytest "$@" ;;
  *)
    echo "usage: bash run.sh sweep [sim.sweep flags] | bash run.sh test [pytest flags]" >&2
    exit 2 ;;
esac
