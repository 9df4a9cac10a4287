"""Turning a dataset Sample into prompt token ids (and forced continuation ids), within a token budget."""
from __future__ import annotations

from traces.datasets import DatasetInfo, Sample

# Continuation-like tasks keep the end of an over-long document (the text right before what follows);
# summarization and dialogue keep its beginning (news leads carry the summary).
KEEP_TAIL_TASKS = ("continuation", "language-modeling")


def prompt_format(lm, sample: Sample) -> str:
    """'chat' when an instruction goes to an instruction-tuned model, else 'plain'."""
    return "chat" if (lm.chat and sample.instruction) else "plain"


def _render(lm, sample: Sample, document: str) -> list[int]:
    tok = lm.tokenizer
    if prompt_format(lm, sample) == "chat":
        content = f"{sample.instruction}\n\n{document}"
        ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                      tokenize=True)
        if not isinstance(ids, list):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    text = f"{document}\n\n{sample.instruction}\n" if sample.instruction else document
    return list(tok(text).input_ids)


def prompt_ids(lm, sample: Sample, info: DatasetInfo, max_prompt_tokens: int | None) -> list[int]:
    """Token ids of the prompt; an over-long document is cut (never the instruction) to fit the budget."""
    ids = _render(lm, sample, sample.document)
    if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
        return ids
    overhead = len(_render(lm, sample, ""))
    if overhead >= max_prompt_tokens:
        raise ValueError(f"--max-prompt-tokens {max_prompt_tokens} leaves no room for the document of sample "
                         f"{sample.id} (instruction and template take {overhead} tokens)")
    doc = list(lm.tokenizer(sample.document, add_special_tokens=False).input_ids)
    budget = max_prompt_tokens - overhead
    # Decoding and re-encoding a cut can merge tokens differently: shrink until the result fits.
    for _ in range(8):
        part = doc[-budget:] if info.task in KEEP_TAIL_TASKS else doc[:budget]
        ids = _render(lm, sample, lm.tokenizer.decode(part, skip_special_tokens=True))
        if len(ids) <= max_prompt_tokens:
            return ids
        budget -= len(ids) - max_prompt_tokens
    return ids[:max_prompt_tokens] if info.task not in KEEP_TAIL_TASKS else ids[-max_prompt_tokens:]


def forced_ids(lm, sample: Sample, n_tokens: int) -> list[int]:
    """The reference continuation's first n_tokens ids (teacher forcing); error when it is too short."""
    ids = list(lm.tokenizer(sample.reference, add_special_tokens=False).input_ids)[:n_tokens]
    if len(ids) < n_tokens:
        raise ValueError(f"sample {sample.id}: the reference has only {len(ids)} tokens, "
                         f"fewer than --max-new-tokens {n_tokens}")
    return ids


def max_positions(lm) -> int | None:
    """Positions the model was built for (max_position_embeddings, MPT's max_seq_len), or None."""
    cfg = lm.model.config
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "max_seq_len", None) or None


def check_positions(lm, prompts: dict, max_new_tokens: int) -> None:
    """Every prompt plus the tokens to generate (or force) must fit the model's positions: one line naming
    the longest sample otherwise, before any run (as keyformer.generate rejects the same input)."""
    limit = max_positions(lm)
    if not limit or not prompts:
        return
    sample, ids = max(prompts.items(), key=lambda item: len(item[1]))
    if len(ids) + max_new_tokens > limit:
        room = limit - max_new_tokens
        hint = (f"cut prompts with --max-prompt-tokens {room}" if room > 0
                else f"--max-new-tokens must be below {limit}")
        raise ValueError(f"sample {sample}: prompt ({len(ids)} tokens) + --max-new-tokens {max_new_tokens} exceeds "
                         f"the model's {limit} positions; {hint}")
