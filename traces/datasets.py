"""Real inputs for captures, read from the assets folder (torch-free; never copied into the repo).

`load_samples(name, n, seed)` returns `Sample`s: an instruction, a document and a reference. How they
become token ids (chat template or plain text, truncation) is the capture's business (traces.capture).

Names (see also `DATASETS`):
- `xsum`: 1000 XSum test articles with gold one-sentence summaries (the H2O/HELM copy).
- `cnndm`: 100 CNN/DailyMail validation articles; the reference is a GPT-4-written summary, not the
  original highlights (the only references in the assets), so ROUGE against it is an approximation.
- `soda`: 5 SODA dialogues: narrative + first turn in, the remaining turns as the reference (Keyformer's
  conversation task).
- `dialogsum`: 5 DialogSum dialogues with their human summaries.
- `long-text`: consecutive chunks of Alice's Adventures in Wonderland (public domain), teacher-forced:
  the first half of each chunk is the prompt, the second half is forced, for perplexity and top-1
  agreement. `long-text:NAME` picks another file from long_text/ (e.g. `long-text:sotu_speeches`).
- `tinystories`: the 5 TinyStories stories of the assets, each cut at 40 points (prompt = the story so far,
  reference = the rest): 200 continuation samples for stories260K, in 5 clusters (one per story).
- `jsonl:PATH`: your own file, one JSON object per line with `text` (or `document`) and optional
  `reference`, `instruction`, `id`.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from traces.assets import asset


@dataclass(frozen=True)
class Sample:
    id: str
    document: str  # the part that may be truncated to fit --max-prompt-tokens
    instruction: str = ""  # task text kept whole (empty for plain continuation)
    reference: str = ""  # gold output ('' where the dataset has none)
    instruction_first: bool = False  # dialogue tasks put the instruction before the document


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    mode: str  # "generate" (free greedy generation) or "teacher_forced" (the reference is forced)
    task: str  # "summarization" | "dialogue" | "continuation" | "language-modeling"
    source: str  # asset path(s), for the manifest


DATASETS = {
    "xsum": DatasetInfo("xsum", "generate", "summarization", "news_summarization/xsum_1000_h2o.jsonl"),
    "cnndm": DatasetInfo("cnndm", "generate", "summarization",
                         "news_summarization/cnndm_val100_gpt4ref_sumllm.jsonl (GPT-4 references)"),
    "soda": DatasetInfo("soda", "generate", "dialogue", "dialogue/soda_5.json"),
    "dialogsum": DatasetInfo("dialogsum", "generate", "summarization", "dialogue/dialogsum_5.json"),
    "long-text": DatasetInfo("long-text", "teacher_forced", "language-modeling", "long_text/gutenberg_pg11.txt"),
    "tinystories": DatasetInfo("tinystories", "generate", "continuation", "long_text/tinystories_sample.txt"),
}

SUMMARIZE_ONE_SENTENCE = "Summarize the following article in one sentence."
SUMMARIZE_NEWS = "Summarize the following news article in a few sentences."
SUMMARIZE_DIALOGUE = "Summarize the following dialogue."


def dataset_info(name: str) -> DatasetInfo:
    if name.startswith("jsonl:"):
        return DatasetInfo("jsonl", "generate", "custom", name[len("jsonl:"):])
    if name.startswith("long-text:"):
        stem = name.split(":", 1)[1]
        return DatasetInfo(name, "teacher_forced", "language-modeling", f"long_text/{stem}.txt")
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r} (choose from {', '.join(DATASETS)}, long-text:NAME, jsonl:PATH)")
    return DATASETS[name]


def load_samples(name: str, n: int, seed: int = 0, long_text_chars: int = 6000) -> list[Sample]:
    """The first `n` samples of a fixed, seeded order (the same n and seed give the same ids)."""
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    if name.startswith("jsonl:"):
        samples = _jsonl(Path(name[len("jsonl:"):]).expanduser())
    elif name == "long-text" or name.startswith("long-text:"):
        stem = name.split(":", 1)[1] if ":" in name else "gutenberg_pg11"
        samples = _long_text(stem, long_text_chars)
    else:
        samples = {"xsum": _xsum, "cnndm": _cnndm, "soda": _soda, "dialogsum": _dialogsum,
                   "tinystories": _tinystories}[dataset_info(name).name]()
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    return [samples[i] for i in order[:n]]


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}: line {lineno} is not valid JSON") from None
    return rows


def _xsum() -> list[Sample]:
    out = []
    for i, row in enumerate(_read_jsonl(asset("news_summarization", "xsum_1000_h2o.jsonl"))):
        # The file wraps each article in a HELM prompt: "###\nArticle: ...\n\nSummarize the above ...".
        text = row["article"].split("Article:", 1)[-1].rsplit("\n\nSummarize the above article", 1)[0]
        out.append(Sample(f"xsum-{i}", text.strip(), SUMMARIZE_ONE_SENTENCE, row["summary_gt"].strip()))
    return out


def _cnndm() -> list[Sample]:
    rows = _read_jsonl(asset("news_summarization", "cnndm_val100_gpt4ref_sumllm.jsonl"))
    return [Sample(f"cnndm-{i}", r["article"].strip(), SUMMARIZE_NEWS, r["abstract"].strip())
            for i, r in enumerate(rows)]


def _soda() -> list[Sample]:
    out = []
    for i, row in enumerate(json.loads(asset("dialogue", "soda_5.json").read_text())):
        turns = [f"{s}: {t}" for s, t in zip(row["speakers"], row["dialogue"])]
        a, b = row["speakers"][0], row["speakers"][1] if len(row["speakers"]) > 1 else "B"
        instruction = f"Generate a dialogue between {a} and {b} given the narrative above."
        document = f"{row['narrative']}\n\n{instruction}\n\n{turns[0]}"
        out.append(Sample(f"soda-{i}", document, "", "\n".join(turns[1:])))
    return out


def _dialogsum() -> list[Sample]:
    rows = json.loads(asset("dialogue", "dialogsum_5.json").read_text())
    return [Sample(f"dialogsum-{r.get('fname', i)}", r["dialogue"].strip(), SUMMARIZE_DIALOGUE,
                   r["summary"].strip()) for i, r in enumerate(rows)]


def _long_text(stem: str, chunk_chars: int) -> list[Sample]:
    """Non-overlapping chunks; each is split in half: prompt, then the forced continuation."""
    text = asset("long_text", f"{stem}.txt").read_text(encoding="utf-8", errors="replace")
    # Skip the Project Gutenberg header so chunks hold the book itself.
    marker = text.find("*** START OF")
    if marker >= 0:
        text = text[text.find("\n", marker) + 1:]
    out = []
    for i, start in enumerate(range(0, len(text) - chunk_chars, chunk_chars)):
        chunk = text[start:start + chunk_chars]
        cut = chunk.rfind(" ", 0, chunk_chars // 2) + 1 or chunk_chars // 2
        out.append(Sample(f"{stem}-{i}", chunk[:cut], "", chunk[cut:]))
    return out


def _tinystories() -> list[Sample]:
    text = asset("long_text", "tinystories_sample.txt").read_text(encoding="utf-8")
    stories = [s.strip() for s in text.split("<|endoftext|>") if s.strip()]
    out = []
    for i, story in enumerate(stories):
        words = story.split(" ")
        # 40 cuts per story, after 30.0%, 31.5%, ... 88.5% of the words: the model continues from there. The
        # assets hold 5 stories, so the 200 samples are 5 clusters of overlapping prompts: quality.py
        # bootstraps them by story (TINYSTORIES_CLUSTER), not as 200 independent samples.
        for permille in range(300, 900, 15):
            cut = max(1, len(words) * permille // 1000)
            out.append(Sample(f"tinystories-{i}-{permille}", " ".join(words[:cut]), "", " ".join(words[cut:])))
    return out


def _jsonl(path: Path) -> list[Sample]:
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} not found")
    out = []
    for i, row in enumerate(_read_jsonl(path)):
        document = row.get("text", row.get("document"))
        if not isinstance(document, str):
            raise ValueError(f"{path}: record {i + 1} has no 'text' string")
        out.append(Sample(str(row.get("id", i)), document, row.get("instruction", ""), row.get("reference", "")))
    if not out:
        raise ValueError(f"{path}: no records")
    return out
