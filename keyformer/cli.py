"""`python -m keyformer.generate` (and `python -m keyformer`): greedy generation under a KV-cache policy that
physically evicts, on a local model folder. The flags are GenerateRequest's fields (kvcommon.fields): help,
checks and defaults declared once; an input mistake is one `error: ...` line and exit code 2.

--policy is any of keyformer.POLICIES (all ten) or a variant in the project's one grammar
(`keyformer:selection=official`, `h2o:recent_ratio=0.2`, or a trace's label `keyformer(noise=none)`): its keys
are the policy class's parameters (kvcommon.policy_params reads them from the classes, as sim/ does), so a
parameter a class gains is a variant key here without a list to update. --recent-ratio and --noise are
shorthands for the keys of the same name."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import keyformer
from keyformer import compat, make_policy
from keyformer.generate import decode_n_tokens, prefill
from kvcommon.cli import OneLineParser
from kvcommon.design import CACHE_RATIO_RANGE, RECENT_RATIO_RANGE
from kvcommon.fields import add_flags, at_least, from_args, param, validate
from kvcommon.policy_params import read_policy_parameters
from kvcommon.variants import PolicyVariant, check_variant

POLICY_NAMES = tuple(keyformer.POLICIES)   # the one registry: every policy keyformer/ implements
RESERVED = {"cache_ratio": "give it with --cache-ratio"}   # variant keys that have their own flag


def declared_parameters(name: str) -> dict:
    """The parameters policy `name`'s class declares (kvcommon.policy_params over this package's source)."""
    return read_policy_parameters(Path(keyformer.__file__).resolve().parent).get(name, {})


@dataclass(frozen=True)
class GenerateRequest:
    model: str = param(help="local model folder (or a name already in the HF cache)")
    policy: str = param(help=f"{', '.join(POLICY_NAMES)}, or a variant name:key=value,... of the policy's "
                             "parameters (keyformer:selection=official, keyformer:budget_base=padded, "
                             "h2o:recent_ratio=0.2)")
    cache_ratio: float | None = param(None, check=CACHE_RATIO_RANGE,
                                      help="KV budget as a fraction of the real prompt length (required except for full)")
    recent_ratio: float | None = param(None, check=RECENT_RATIO_RANGE,
                                       help="recent window as a fraction of the budget (the variant key "
                                            "recent_ratio; default: the policy's own)")
    noise: str | None = param(None, help="keyformer's logit noise: the variant key noise (default gumbel)")
    max_new_tokens: int = param(32, check=at_least(1))
    prompt: str | None = param(None)
    prompt_file: str | None = param(None)
    seed: int = param(0)
    device: str = param("cpu", choices=("cpu", "cuda"))
    json: bool = param(False, help="print one JSON object")

    def __post_init__(self):
        validate(self)


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m keyformer.generate",
                           description="Greedy generation under a KV-cache policy that physically evicts.")
    add_flags(parser, GenerateRequest, ["model", "policy", "cache_ratio", "recent_ratio", "noise", "max_new_tokens"])
    prompt = parser.add_mutually_exclusive_group(required=True)
    add_flags(prompt, GenerateRequest, ["prompt", "prompt_file"])
    add_flags(parser, GenerateRequest, ["seed", "device", "json"])
    return parser.parse_args(argv)


class UsageError(ValueError):
    """A user mistake on the command line (exit code 2)."""


def load_model(name: str, device: str):
    """Model and tokenizer from a local folder (or an already cached hub name); never downloads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    looks_like_path = os.sep in name or name.startswith(".") or Path(name).exists()
    if looks_like_path and not Path(name).is_dir():
        raise UsageError(f"model directory {name} does not exist")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(name, local_files_only=True, attn_implementation="eager",
                                                     dtype=torch.float32)
    except Exception as exc:  # any loader failure is the user's model argument
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot load model {name!r}: {reason}") from None
    model.config.use_cache = True  # MptConfig defaults to False
    model.generation_config.use_cache = True
    return model.to(device).eval(), tokenizer


def check_args(args: argparse.Namespace) -> GenerateRequest:
    """GenerateRequest's field checks on the parsed flags, worded for the flags (UsageError)."""
    try:
        return from_args(GenerateRequest, args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def read_variant(text: str) -> PolicyVariant:
    """--policy as a checked variant: a known name, keys its class declares, listed values (UsageError)."""
    try:
        variant = PolicyVariant.read(text)
        if variant.name not in keyformer.POLICIES:
            raise ValueError(f"unknown policy {variant.name!r}; expected one of {', '.join(POLICY_NAMES)}")
        return check_variant(variant, declared_parameters(variant.name), RESERVED)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _uses(name: str, key: str) -> bool:
    """Whether policy `name` takes the shorthand flag's key: its class declares it (recent_ratio: and it
    evicts; what a recent ratio means to it, or whether it allows one, is the class's to say)."""
    return key in declared_parameters(name) and (key != "recent_ratio" or keyformer.POLICIES[name].evicts)


def policy_from_args(args: argparse.Namespace):
    check_args(args)
    variant = read_variant(args.policy)
    params = dict(variant.params)
    if variant.name != "full" and args.cache_ratio is None:
        raise UsageError(f"--policy {variant.name} needs --cache-ratio (the KV budget, a fraction in (0, 1])")
    if args.cache_ratio is not None:
        params["cache_ratio"] = args.cache_ratio
    for flag, key, value in (("--recent-ratio", "recent_ratio", args.recent_ratio), ("--noise", "noise", args.noise)):
        if value is None:
            continue
        if not _uses(variant.name, key):
            takers = [n for n in POLICY_NAMES if _uses(n, key)]
            raise UsageError(f"{flag} applies to {', '.join(takers)}, not {variant.name}")
        if key in params and params[key] != value:
            raise UsageError(f"--policy {args.policy} sets {key}={params[key]} and {flag} {value}: give one")
        params[key] = value
    declared = declared_parameters(variant.name)
    for key, value in (("seed", args.seed), ("max_new_tokens", args.max_new_tokens)):   # the run's own
        if key in declared:
            params.setdefault(key, value)
    try:
        return make_policy(variant.name, **params)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> dict:
    """Generate for the parsed flags; the result as one JSON-able dict."""
    check_args(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if args.prompt_file is not None:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise UsageError(f"prompt file {path} does not exist")
        text = path.read_text(encoding="utf-8")
    else:
        text = args.prompt
    if not text.strip():
        raise UsageError("the prompt is empty")
    policy = policy_from_args(args)
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.model, args.device)
    input_ids = tokenizer(text, return_tensors="pt").input_ids.to(args.device)
    if input_ids.shape[1] == 0:
        raise UsageError("the prompt encodes to no tokens")
    max_positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "max_seq_len", None)
    if max_positions and input_ids.shape[1] + args.max_new_tokens > max_positions:
        raise UsageError(f"prompt ({input_ids.shape[1]} tokens) + --max-new-tokens {args.max_new_tokens} exceeds "
                         f"the model's {max_positions} positions")
    with prefill(model, policy, input_ids) as state:
        decode_n_tokens(state, args.max_new_tokens - 1, eos_token_id=tokenizer.eos_token_id)
        new_tokens = state.tokens[0].tolist()
        if tokenizer.eos_token_id in new_tokens:
            new_tokens = new_tokens[:new_tokens.index(tokenizer.eos_token_id)]
        return {
            "text": tokenizer.decode(new_tokens, skip_special_tokens=True),
            "model": args.model,
            "policy": policy.name,
            "label": PolicyVariant.read(args.policy).label,   # the variant as traces and the simulator store it
            "params": policy.params(),
            "prompt_tokens": int(input_ids.shape[1]),
            "generated_tokens": len(new_tokens),
            "kv_budget": int(policy.budget[0]),
            "recent_window": int(policy.recent[0]),
            "kv_lengths": policy.kv_lengths(),
            "kv_bytes": policy.kv_bytes(),
            "prefill_s": state.prefill_s,
            "decode_step_s": statistics.median(state.step_s) if state.step_s else None,
            "decode_steps": len(state.step_s),
            "score_flops": policy.score_work.flops,
            "device": args.device,
            "seed": args.seed,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "torch_threads": torch.get_num_threads(),
            "transformers": compat.TRANSFORMERS_VERSION,
        }


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except (UsageError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # library-level refusals (unsupported architecture, bad budget, ...)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print(result["text"])
        print(f"[{result['label']}: prompt {result['prompt_tokens']} tokens, budget {result['kv_budget']}, "
              f"kv_lengths {result['kv_lengths']}, median decode step {result['decode_step_s']}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
