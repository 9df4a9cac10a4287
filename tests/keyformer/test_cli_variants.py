"""Issue 27 item 4: keyformer.generate runs all ten policies and their variants (the project's one grammar),
and its --help and traces.capture's list all ten, from the one registry (keyformer.POLICIES). The variant keys
every CLI checks are read from the policy classes' source (kvcommon.policy_params): here, that reading is held
against the classes themselves."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import keyformer
from keyformer.cli import declared_parameters, main
from traces.assets import assets_dir, have_assets

STORIES = ("stories260K", "hf")
needs_stories = pytest.mark.skipif(not have_assets(*STORIES),
                                   reason=f"stories260K/hf not found under {assets_dir()} (set KVSIM_ASSETS)")
PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
TEN = ", ".join(keyformer.POLICIES)


@pytest.mark.parametrize("name", list(keyformer.POLICIES))
def test_the_source_reading_matches_the_classes(name):
    cls = keyformer.POLICIES[name]
    declared = declared_parameters(name)
    fields = {f.name: f.default for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}
    assert {k: p.default for k, p in declared.items()} == fields
    for key, param in declared.items():     # every value the reading lists is one the class takes
        for value in param.choices or ():
            kwargs = {key: value} if key != "position_mode" or not cls.variable_lengths else {}
            cls(**kwargs)


def test_help_texts_list_all_ten(capsys):
    assert len(keyformer.POLICIES) == 10
    with pytest.raises(SystemExit):
        main(["--help"])
    assert TEN in " ".join(capsys.readouterr().out.split())
    from traces.capture.__main__ import build_parser
    assert TEN in " ".join(build_parser().format_help().split())


def generate(capsys, *argv) -> dict:
    code = main(["--model", str(assets_dir().joinpath(*STORIES)), "--prompt", PROMPT, "--max-new-tokens", "4",
                 "--json", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@needs_stories
@pytest.mark.parametrize("name", list(keyformer.POLICIES))
def test_generate_runs_every_policy(capsys, name):
    result = generate(capsys, "--policy", name, *(["--cache-ratio", "0.5"] if name != "full" else []))
    assert result["policy"] == name == result["label"] and result["generated_tokens"] >= 1
    if name != "full":
        assert result["kv_budget"] == result["prompt_tokens"] // 2


@needs_stories
def test_generate_runs_variants(capsys):
    official = generate(capsys, "--policy", "keyformer:selection=official,noise=none", "--cache-ratio", "0.5")
    assert official["label"] == "keyformer(noise=none,selection=official)"
    assert official["params"]["selection"] == "official" and official["params"]["noise"] == "none"
    padded = generate(capsys, "--policy", "keyformer(budget_base=padded)", "--cache-ratio", "0.5")
    assert padded["kv_budget"] == 1920 // 2          # k from the padded length, not the prompt's
    recent = generate(capsys, "--policy", "h2o:recent_ratio=0.2", "--cache-ratio", "0.5")
    assert recent["params"]["recent_ratio"] == 0.2 and recent["recent_window"] == int(0.2 * recent["kv_budget"])
    sinks = generate(capsys, "--policy", "streaming:n_sinks=2", "--cache-ratio", "0.5")
    assert sinks["params"]["n_sinks"] == 2


def test_capture_labels_are_what_the_simulator_reads(tmp_path):
    """traces.capture stores a variant under the label sim.predict/sim.serve/sim.sweep take back (either spelling
    in, one label out)."""
    from sim import policies
    from traces.capture import CaptureConfig
    typed = ["keyformer:selection=official", "keyformer(budget_base=padded)", "h2o:recent_ratio=0.20"]
    config = CaptureConfig(model="stories260k", policies=typed, dataset="tinystories", out=tmp_path / "t")
    labels = [spec.label for spec in config.specs]
    assert labels == ["keyformer(selection=official)", "keyformer(budget_base=padded)", "h2o(recent_ratio=0.2)"]
    assert [policies.label(text) for text in typed] == labels == [policies.label(label) for label in labels]
