"""`python -m traces.decisive.beams --out DIR`: the pre-registered beam-4 subset (docs/traces.md,
"Pre-registered experiment"): the first 50 CNN/DailyMail articles of the capture's order, summarised by
beam search with 4 beams under full, H2O and Keyformer in the released code's selection with its 4-draw
prompt score (`selection=official, beam_noise=summed`: each beam row of one prompt draws its own noise and
the rows rank by their sum), at cache ratios 0.2, 0.3 and 0.5.

traces.capture decodes greedily (one row per sample, a per-step trace); beam search keeps 4 rows per article
that transformers reorders every step (the policy's cache follows through reorder_cache), so this runs
transformers' `generate(num_beams=4, do_sample=False)` on the policy-applied model and keeps only what the
quality comparison needs: the text, cut at the first end-of-sequence token as the greedy capture cuts it.
Prompts are the capture's (chat template, the article cut to --max-prompt-tokens), the noise stream of an
article is the capture's (seed, article id).

Every run (policy, ratio, article) is one JSON shard under DIR/shards/, written whole or not at all: rerun
the same command after an interruption and only the missing runs are done. Once all are there, DIR/beams.csv
(per article ROUGE-1/2/L against the reference) and DIR/report.md (means and the paired comparison Keyformer
official - H2O ROUGE-2 per ratio: sign-flip p, Holm-corrected over the three ratios, effect in % of full with
its 95% bootstrap interval; exploratory, outside the primary test) are written.
"""
from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

from kvcommon.cli import OneLineParser, atomic_write_text, parse_part, positive_int, progress_disabled, run

POLICIES = ("full", "h2o", "keyformer:selection=official,beam_noise=summed")
RATIOS = (0.2, 0.3, 0.5)
SHARDS = "shards"


def ratios_for(spec, ratios) -> tuple:
    """The full cache has one setting, 1.0 (as in traces.capture); the others run at every ratio."""
    return (1.0,) if spec.name == "full" else tuple(ratios)


def planned_runs(specs, ratios, samples) -> list[tuple]:
    """(spec, ratio, sample) in a fixed order."""
    return [(spec, ratio, sample) for spec in specs for ratio in ratios_for(spec, ratios) for sample in samples]


def shard_path(out: Path, spec, ratio: float, sample_id: str) -> Path:
    from traces.capture import store

    return out / SHARDS / (store.shard_key(spec.label, ratio, sample_id) + ".json")


def beam_text(lm, spec, ratio: float, prompt: list[int], sample_id: str, beams: int, max_new_tokens: int,
              seed: int) -> dict:
    """One article under one policy: beam search's best sequence, decoded up to its first EOS."""
    import torch

    from traces.capture.run import make_policy, rules_metadata, sample_stream

    policy = make_policy(spec, ratio, None, max_new_tokens, seed)
    if hasattr(policy, "sample_indices"):     # the article's noise stream; its beams are replicas 0..beams-1
        policy.sample_indices = [sample_stream(sample_id)]
    device = next(lm.model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    eos = lm.tokenizer.eos_token_id
    started = time.perf_counter()
    with torch.no_grad(), policy.apply(lm.model):
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=beams, num_return_sequences=1,
                                do_sample=False, max_new_tokens=max_new_tokens,
                                pad_token_id=lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else eos)
    generated = out[0, len(prompt):].tolist()
    cut = generated.index(eos) if eos in generated else len(generated)
    return {"sample": sample_id, "policy": spec.label, "cache_ratio": ratio, "beams": beams,
            "generated": lm.tokenizer.decode(generated[:cut], skip_special_tokens=True).strip(),
            "n_generated": cut, "stopped_at_eos": cut < len(generated), "prompt_tokens": len(prompt),
            "wall_s": time.perf_counter() - started, **rules_metadata(policy)}


def score(out: Path, rows: list[dict], references: dict) -> "pd.DataFrame":
    import pandas as pd

    from traces.quality import _rouge, _scorer

    scorer = _scorer()
    frame = pd.DataFrame(rows)
    rouge = [_rouge(scorer, r["generated"], references[r["sample"]]) for r in rows]
    frame = pd.concat([frame, pd.DataFrame(rouge)], axis=1)
    # every text quoted: a generated "\r" would otherwise end a row for readers that split on it
    atomic_write_text(out / "beams.csv", frame.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC))
    return frame


def report(frame, ratios, official_label: str, h2o_label: str) -> str:
    from traces.decisive import analysis

    comparisons = [analysis.Comparison("cnndm-beam4", "rouge2", r, official_label, h2o_label) for r in ratios]
    tests = analysis.evaluate({"cnndm-beam4": frame}, comparisons)
    means = frame.groupby(["policy", "cache_ratio"])[["rouge1", "rouge2", "rougeL"]].agg(["mean", "count"])
    lines = ["# Beam-4 subset: Keyformer (official, 4-draw prompt score) vs H2O", "",
             f"{', '.join(sorted(set(frame['model'])))}: {frame['sample'].nunique()} CNN/DailyMail articles, "
             f"{int(frame['beams'].iloc[0])} beams, "
             "ROUGE against the GPT-4 references (F-measure x 100). Exploratory: Holm over the ratios, outside the "
             "primary test.", "", "| policy | ratio | ROUGE-1 | ROUGE-2 | ROUGE-L | n |", "|---|---|---|---|---|---|"]
    for (policy, ratio), row in means.iterrows():
        lines.append(f"| {policy} | {ratio:g} | {row[('rouge1', 'mean')]:.2f} | {row[('rouge2', 'mean')]:.2f} | "
                     f"{row[('rougeL', 'mean')]:.2f} | {int(row[('rouge2', 'count')])} |")
    return "\n".join(lines) + "\n\n" + analysis.to_markdown(tests)


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m traces.decisive.beams", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/decisive/beam4", help="folder (default results/decisive/beam4)")
    p.add_argument("--model", default="smollm2-135m", help="model name (default smollm2-135m)")
    p.add_argument("--dataset", default="cnndm", help="dataset (default cnndm: the capture's articles)")
    p.add_argument("--n", type=positive_int, default=50, help="articles (default 50)")
    p.add_argument("--beams", type=positive_int, default=4, help="beams (default 4)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="default 64 (the capture's)")
    p.add_argument("--max-prompt-tokens", type=positive_int, default=768, help="default 768 (the capture's)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="policies (default full, h2o and Keyformer official with the summed beam noise)")
    p.add_argument("--cache-ratios", default=",".join(f"{r:g}" for r in RATIOS), help="default 0.2,0.3,0.5")
    p.add_argument("--seed", type=int, default=0, help="noise seed (default 0, the capture's)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    p.add_argument("--part", default="1/1", metavar="K/N",
                   help="run only every N-th planned run, starting at the K-th (one worker per core: run K = 1..N "
                        "at once on one --out); the part that finds every run done writes the report")
    a = p.parse_args(argv)
    try:
        part, parts = parse_part(a.part)
    except ValueError as exc:
        p.error(str(exc))
    from kvcommon.variants import split_variants
    from traces.capture.spec import PolicySpec
    try:
        specs = [PolicySpec.read(text) for text in split_variants(a.policies)]
        ratios = tuple(float(r) for r in a.cache_ratios.split(","))
    except ValueError as exc:
        p.error(str(exc))
    if not all(0.0 < r <= 1.0 for r in ratios):
        p.error(f"--cache-ratios must lie in (0, 1], got {a.cache_ratios!r}")
    names = {spec.name for spec in specs}
    if not {"full", "h2o"} <= names or "keyformer" not in names:
        p.error("--policies needs full, h2o and a keyformer variant (the report compares them)")
    official = next(spec.label for spec in specs if spec.name == "keyformer")
    h2o = next(spec.label for spec in specs if spec.name == "h2o")

    import torch
    from tqdm import tqdm

    from traces.capture.prompts import prompt_ids
    from traces.capture.run import make_policy
    from traces.datasets import dataset_info, load_samples
    from traces.models import load_model

    for spec in specs:                       # bad names or parameters fail before the data and the model load
        for ratio in ratios_for(spec, ratios):
            make_policy(spec, ratio, None, a.max_new_tokens, a.seed)
    info = dataset_info(a.dataset)
    samples = load_samples(a.dataset, a.n, a.seed)
    out = Path(a.out)
    torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    prompts = {s.id: prompt_ids(lm, s, info, a.max_prompt_tokens) for s in samples}
    (out / SHARDS).mkdir(parents=True, exist_ok=True)
    runs = planned_runs(specs, ratios, samples)
    todo = [run_ for index, run_ in enumerate(runs)
            if index % parts == part - 1 and not shard_path(out, *run_[:2], run_[2].id).exists()]
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), unit="run", desc=f"beam-{a.beams} {lm.name}",
               disable=progress_disabled(None), file=sys.stderr)
    for spec, ratio, sample in todo:
        bar.set_postfix_str(f"{sample.id} {spec.label} r={ratio:g}")
        row = beam_text(lm, spec, ratio, prompts[sample.id], sample.id, a.beams, a.max_new_tokens, a.seed)
        row["model"] = lm.name
        atomic_write_text(shard_path(out, spec, ratio, sample.id), json.dumps(row))
        bar.update(1)
    bar.close()
    missing = sum(not shard_path(out, spec, ratio, sample.id).exists() for spec, ratio, sample in runs)
    if missing:     # other parts still running: the last to finish writes the report
        print(f"{out}: part {part}/{parts} done; {missing} runs of other parts still missing, no report yet",
              file=sys.stderr)
        return 0
    rows = [json.loads(shard_path(out, spec, ratio, sample.id).read_text()) for spec, ratio, sample in runs]
    frame = score(out, rows, {s.id: s.reference for s in samples})
    text = report(frame, ratios, official, h2o)
    atomic_write_text(out / "report.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
