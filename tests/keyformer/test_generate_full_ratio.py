"""keyformer.generate --policy full needs no --cache-ratio (issue 17); every evicting policy still does."""
from __future__ import annotations

import json

import pytest

from keyformer.cli import UsageError, main, parse_args, policy_from_args
from traces.assets import assets_dir, have_assets


def test_full_needs_no_cache_ratio_but_evicting_policies_do():
    args = parse_args(["--model", "m", "--policy", "full", "--prompt", "hi"])
    assert args.cache_ratio is None and policy_from_args(args).name == "full"
    for name in ("window", "streaming", "h2o", "keyformer"):
        with pytest.raises(UsageError, match=f"--policy {name} needs --cache-ratio"):
            policy_from_args(parse_args(["--model", "m", "--policy", name, "--prompt", "hi"]))
    with pytest.raises(UsageError, match="--cache-ratio must be in"):   # a given ratio is still checked
        policy_from_args(parse_args(["--model", "m", "--policy", "full", "--cache-ratio", "2", "--prompt", "hi"]))


@pytest.mark.skipif(not have_assets("stories260K", "hf"), reason=f"stories260K/hf not under {assets_dir()}")
def test_full_runs_without_cache_ratio(capsys):
    code = main(["--model", str(assets_dir() / "stories260K" / "hf"), "--policy", "full", "--prompt",
                 "Once upon a time", "--max-new-tokens", "4", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["generated_tokens"] >= 1


def test_evicting_policy_without_ratio_is_one_line(capsys):
    code = main(["--model", "m", "--policy", "h2o", "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --policy h2o needs --cache-ratio") and err.count("\n") == 1
