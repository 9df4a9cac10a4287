"""The command line (one-line errors, exit 2) and the real trained stories260K model (fluent text at p = 0.5)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from keyformer import make_policy
from keyformer.cli import main
from keyformer.generate import decode_n_tokens, prefill
from traces.assets import assets_dir, have_assets

STORIES = ("stories260K", "hf")
needs_stories = pytest.mark.skipif(not have_assets(*STORIES),
                                   reason=f"stories260K/hf not found under {assets_dir()} (set KVSIM_ASSETS)")
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
          "One day, she saw a big red ball under a tree. She wanted to play with it, but her mom said")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["--model", "/nonexistent/model", "--policy", "h2o", "--cache-ratio", "0.5", "--prompt", "hi"],
     "does not exist"),
    (["--model", "{tmp}", "--policy", "h2o", "--cache-ratio", "0.5", "--prompt", "hi"], "cannot load model"),
    (["--model", "{tmp}", "--policy", "keyformer", "--cache-ratio", "1.5", "--prompt", "hi"], "--cache-ratio must be in (0, 1], got 1.5"),
    (["--model", "{tmp}", "--policy", "h2o", "--cache-ratio", "0.5", "--noise", "none", "--prompt", "hi"],
     "--noise applies to keyformer, not h2o"),
    (["--model", "{tmp}", "--policy", "window", "--cache-ratio", "0.5", "--recent-ratio", "0.2", "--prompt", "x"],
     "recent_ratio must be 1.0"),
    (["--model", "{tmp}", "--policy", "full", "--recent-ratio", "0.2", "--prompt", "x"],
     "--recent-ratio applies to window, streaming, h2o, keyformer"),
    (["--model", "{tmp}", "--policy", "h2o", "--cache-ratio", "0.5", "--prompt-file", "/nonexistent.txt"],
     "prompt file"),
    (["--model", "{tmp}", "--policy", "sparse", "--cache-ratio", "0.5", "--prompt", "hi"],
     "unknown policy 'sparse'; expected one of full, window, streaming, h2o, keyformer, snapkv, tova, mass"),
    (["--model", "{tmp}", "--policy", "snapkv", "--prompt", "hi"], "--policy snapkv needs --cache-ratio"),
    (["--model", "{tmp}", "--policy", "keyformer:selection=bogus", "--cache-ratio", "0.5", "--prompt", "hi"],
     "policy keyformer: selection must be one of paper, official, got 'bogus'"),
    (["--model", "{tmp}", "--policy", "tova:noise=none", "--cache-ratio", "0.5", "--prompt", "hi"],
     "policy tova has no parameter 'noise'; its parameters: "),
    (["--model", "{tmp}", "--policy", "keyformer:noise=none", "--noise", "gaussian", "--cache-ratio", "0.5",
      "--prompt", "hi"], "give one"),
    (["--model", "{tmp}", "--policy", "h2o", "--cache-ratio", "half", "--prompt", "hi"], "expected a number, got 'half'"),
    (["--model", "{tmp}", "--policy", "h2o", "--cache-ratio", "0.5"], "required"),
])
def test_cli_user_mistakes_are_one_line_exit_2(capsys, tmp_path, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        code, out, err = run_cli(capsys, *argv)
    except SystemExit as exc:  # argparse exits by itself
        code, (out, err) = exc.code, capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert out == ""


def test_cli_process_exit_code_and_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "keyformer.generate", "--model", str(tmp_path / "missing"),
                             "--policy", "keyformer", "--cache-ratio", "0.5", "--prompt", "hi"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: model directory {tmp_path / 'missing'} does not exist"]


@needs_stories
def test_cli_json_on_the_real_model(capsys):
    code, out, err = run_cli(capsys, "--model", str(assets_dir().joinpath(*STORIES)), "--policy", "keyformer",
                             "--cache-ratio", "0.5", "--prompt", PROMPT, "--max-new-tokens", "12", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["kv_budget"] == result["prompt_tokens"] // 2
    assert result["kv_lengths"] == [result["kv_budget"]] * 5  # 5 layers, all at k
    assert result["generated_tokens"] >= 1 and result["text"].strip()
    assert result["decode_step_s"] > 0 and 1 <= result["decode_steps"] <= 11  # fewer if EOS came early


def english_vocabulary() -> set[str]:
    """Every word of the real English texts in the assets (stories, novels, speeches): a dictionary."""
    words: set[str] = set()
    for path in assets_dir().joinpath("long_text").glob("*.txt"):
        words |= set(re.findall(r"[a-z]+", path.read_text(encoding="utf-8", errors="ignore").lower()))
    return words


@needs_stories
@pytest.mark.skipif(not have_assets("long_text", "tinystories_sample.txt"), reason="tinystories_sample.txt absent")
def test_real_model_stays_fluent_at_half_the_cache():
    """Keyformer at p = 0.5 on the real trained model: real words, no repetition loop, budget held."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder = assets_dir().joinpath(*STORIES)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    policy = make_policy("keyformer", cache_ratio=0.5, recent_ratio=0.3, max_new_tokens=60)
    with prefill(model, policy, ids) as state:
        decode_n_tokens(state, 59)
        assert policy.kv_lengths() == [ids.shape[1] // 2] * 5
    text = tokenizer.decode(state.tokens[0], skip_special_tokens=True)
    words = re.findall(r"[a-z]+", text.lower())
    assert len(words) >= 25, text
    known = english_vocabulary()
    assert sum(w in known for w in words) / len(words) >= 0.9, text
    four_grams = Counter(zip(words, words[1:], words[2:], words[3:]))
    assert max(four_grams.values()) <= 2, text  # no loop
    assert len(set(words)) / len(words) >= 0.35, text
