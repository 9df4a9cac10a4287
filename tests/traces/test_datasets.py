"""Datasets from the assets folder, and fitting prompts into a token budget."""
from __future__ import annotations

import pytest

from traces.assets import have_assets
from traces.datasets import DATASETS, Sample, dataset_info, load_samples

needs_assets = pytest.mark.skipif(not have_assets("news_summarization"), reason="../shared/assets not present")


@needs_assets
@pytest.mark.assets
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_named_dataset_loads_real_text(name):
    samples = load_samples(name, 3, seed=0)
    assert 1 <= len(samples) <= 3
    for sample in samples:
        assert len(sample.document) > 100
        assert len({s.id for s in samples}) == len(samples)
    if name != "long-text":
        assert all(s.reference for s in samples)


@needs_assets
@pytest.mark.assets
def test_order_is_seeded_and_xsum_strips_the_helm_wrapper():
    assert [s.id for s in load_samples("xsum", 5, seed=1)] == [s.id for s in load_samples("xsum", 5, seed=1)]
    assert [s.id for s in load_samples("xsum", 5, seed=1)] != [s.id for s in load_samples("xsum", 5, seed=2)]
    sample = load_samples("xsum", 1)[0]
    assert "Summarize the above" not in sample.document and not sample.document.startswith("###")
    assert len(load_samples("tinystories", 500)) == 200  # 5 stories x 40 cut points


def test_unknown_names_and_bad_files(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        dataset_info("nope")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_samples(f"jsonl:{tmp_path / 'missing.jsonl'}", 1)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_samples(f"jsonl:{tmp_path / 'bad.jsonl'}", 2)
    assert dataset_info("long-text:sotu_speeches").mode == "teacher_forced"


def test_prompt_budget_cuts_the_document_not_the_instruction():
    pytest.importorskip("torch")
    from traces.capture.prompts import prompt_ids
    from traces.models import tiny_random_model

    lm = tiny_random_model("tiny-llama")
    instruction = "Summarize:"
    sample = Sample("x", "abcdefghij" * 20, instruction, "ref")
    ids = prompt_ids(lm, sample, dataset_info("xsum"), 60)
    text = lm.tokenizer.decode(ids)
    assert len(ids) <= 60 and text.rstrip().endswith(instruction) and text.startswith("abcdefghij")
    story = Sample("y", "0123456789" * 20)
    tail = lm.tokenizer.decode(prompt_ids(lm, story, dataset_info("tinystories"), 30))
    assert tail.endswith("789") and len(tail) <= 30  # continuation keeps the end of the text
