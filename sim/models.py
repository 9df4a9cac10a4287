"""Transformer shapes the simulator needs, read from Hugging Face `config.json` files.

`load_model("llama-3-8b")` reads a shipped config (sim/models/<name>.json, HF format plus a "_source"
note); `load_model("path/to/config.json")` or `load_model("path/to/model_folder")` reads any HF config of
a supported model type. Each model type names its fields differently; `_READERS` maps them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from hwmodels.dtypes import dtype_bytes
from sim.model_names import MODELS_DIR, list_models, resolve_name  # noqa: F401  (list_models: sim.models' API)

POSITIONAL = ("rope", "alibi", "learned")
UNQUANTISED_BYTES = 2.0     # a weight-quantised checkpoint's embedding, LM head and norms stay 16-bit


def unquantised_bytes(nbytes):
    """Bytes per parameter of the layers weight quantisation leaves alone (ModelSpec.unquantised_params) when
    the linear layers take `nbytes`: never below 16 bits. A Python float stays one (the DES's float path)."""
    if isinstance(nbytes, np.ndarray):
        return np.maximum(nbytes, UNQUANTISED_BYTES)
    return max(nbytes, UNQUANTISED_BYTES)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    gated_mlp: bool
    tied_embeddings: bool
    positional: str
    max_positions: int | None
    source: str = ""
    # the config's sliding attention window (Mistral-7B-v0.1: 4096); None when absent or null. sim.kvlen
    # caps the KV held by the `sliding_layers` below at it; engine profiles read it too (a cyclic KV cache
    # changes which decode-attention kernel an engine runs, sim/profiles/engines.py)
    sliding_window: int | None = None
    # the layers that keep only the last `sliding_window` tokens (sim.kvlen caps their KV there): every layer
    # of Mistral with a window, Qwen2's from max_window_layers on with use_sliding_window, or the config's
    # layer_types "sliding_attention" entries; () when none does
    sliding_layers: tuple[int, ...] = ()
    # mixture of experts (Mixtral): each layer's MLP is n_experts experts of width d_ff, a router sends each
    # token to experts_per_token of them; 1 and 1 for a dense model
    n_experts: int = 1
    experts_per_token: int = 1

    def __post_init__(self):
        for field in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"model {self.name}: {field} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model {self.name}: n_heads={self.n_heads} is not a multiple of "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.positional not in POSITIONAL:
            raise ValueError(f"model {self.name}: positional must be one of {POSITIONAL}, got {self.positional!r}")
        if any(not 0 <= i < self.n_layers for i in self.sliding_layers) or len(set(self.sliding_layers)) != len(
                self.sliding_layers):
            raise ValueError(f"model {self.name}: sliding_layers must be distinct layer indices below {self.n_layers}")
        if self.sliding_layers and self.sliding_window is None:
            raise ValueError(f"model {self.name}: sliding_layers without a sliding_window")
        for field in ("n_experts", "experts_per_token"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"model {self.name}: {field} must be a positive integer, got {value!r}")
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"model {self.name}: experts_per_token={self.experts_per_token} exceeds "
                             f"n_experts={self.n_experts}")

    @property
    def weights_in_out(self) -> bool:
        """Projection weights stored [in, out] and applied as x @ W: transformers' Conv1D (GPT-2 and
        Cerebras-GPT, model_type gpt2: c_attn, c_proj, c_fc); its LM head is an nn.Linear like every
        model's. A CPU BLAS runs few-row GEMMs of the two layouts at different rates (hwmodels
        gemm_rows_in_out_efficiency)."""
        return self.model_type == "gpt2"

    @property
    def windowed_layers(self) -> int:
        """Layers that keep at most `sliding_window` tokens (0: every layer holds the whole context)."""
        return len(self.sliding_layers) if self.sliding_window else 0

    @property
    def attention(self) -> str:
        """MHA, GQA or MQA: how many query heads share one KV head."""
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    # --- parameter counts (biases ignored: < 0.1% of any model here) ---
    def attn_params_per_layer(self) -> int:
        q_and_out = 2 * self.d_model * self.n_heads * self.head_dim
        k_and_v = 2 * self.d_model * self.n_kv_heads * self.head_dim
        return q_and_out + k_and_v

    def expert_params(self) -> int:
        """One expert's MLP (the whole MLP of a dense model)."""
        return (3 if self.gated_mlp else 2) * self.d_model * self.d_ff

    def router_params(self) -> int:
        return self.d_model * self.n_experts if self.moe else 0

    def mlp_params_per_layer(self) -> int:
        return self.n_experts * self.expert_params() + self.router_params()

    @property
    def moe(self) -> bool:
        return self.n_experts > 1

    def experts_touched(self, tokens):
        """Mean experts per layer a pass over `tokens` tokens reads (1 for a dense model). Each token goes to
        experts_per_token distinct experts; with routing independent and uniform an expert is missed by all
        tokens with probability (1 - k/E)^tokens, so E (1 - (1 - k/E)^tokens) are read: k at one token, all
        E from a few dozen tokens on. A skewed real router can only lower the count."""
        if not self.moe:
            return 1.0
        e, k = self.n_experts, self.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** np.asarray(tokens, float))
        return np.maximum(touched, float(k))

    def weight_bytes_read(self, tokens, dtype: str = "bf16"):
        """Weight bytes a forward pass over `tokens` tokens streams: all of a dense model; for a mixture of
        experts, only the experts its tokens are routed to (experts_touched)."""
        unread = self.n_experts - self.experts_touched(tokens)
        nbytes = dtype_bytes(dtype)
        return self.weight_bytes_at(nbytes) - self.n_layers * unread * self.expert_params() * nbytes

    def embedding_params(self) -> int:
        learned_pos = self.max_positions * self.d_model if self.positional == "learned" and self.max_positions else 0
        return self.vocab_size * self.d_model + learned_pos

    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.d_model

    def n_params(self) -> int:
        per_layer = self.attn_params_per_layer() + self.mlp_params_per_layer() + 2 * self.d_model  # 2 norms
        return self.n_layers * per_layer + self.embedding_params() + self.lm_head_params() + self.d_model

    def unquantised_params(self) -> int:
        """Parameters a weight-quantised checkpoint keeps in 16 bits: the embedding, the LM head and the norms.
        FP8/INT8/INT4 schemes quantise the transformer blocks' linear layers only (TensorRT Model Optimizer's
        default configs and vLLM's fp8/AWQ/GPTQ methods leave lm_head, embeddings and norms unquantised)."""
        return self.embedding_params() + self.lm_head_params() + (2 * self.n_layers + 1) * self.d_model

    def weight_bytes_at(self, nbytes):
        """Bytes of the weights at `nbytes` per quantised parameter (a float or an array): the linear layers at
        that size, the unquantised_params at 16 bits or more."""
        quantised, held = self._param_split
        return quantised * nbytes + held * unquantised_bytes(nbytes)

    @cached_property
    def _param_split(self) -> tuple[int, int]:
        """(quantised, unquantised) parameter counts, counted once per spec (the engine asks per memory read).
        cached_property writes the instance's __dict__, which a frozen dataclass allows."""
        held = self.unquantised_params()
        return self.n_params() - held, held

    def weight_bytes(self, dtype: str = "bf16") -> float:
        return float(self.weight_bytes_at(dtype_bytes(dtype)))

    def layer_activation_elems(self, tp: int = 1):
        """Elements per token of one layer's activations that live at once: residual, normed input and output
        (3 d) plus q/k/v and the MLP intermediate, split over a TP group of `tp` devices."""
        return 3 * self.d_model + ((self.n_heads + 2 * self.n_kv_heads) * self.head_dim
                                   + (2 if self.gated_mlp else 1) * self.d_ff) / tp

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """Bytes of K and V for one token, all layers, one sequence."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def to_dict(self) -> dict:
        out = asdict(self)
        if not self.moe:    # a dense model's dict (and so its content_hash) as before experts existed
            del out["n_experts"], out["experts_per_token"]
        return out

    @property
    def content_hash(self) -> str:
        """16 hex digits of the spec's content (every field): results computed for one spec are reused only
        for the same shapes (sweep caches, traced grids)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


# --- sliding-window layers: the KV a model's layers can hold ---

def windowed(model, tokens):
    """Mean over layers of the tokens per KV head when every layer would hold `tokens`: sliding-window
    layers hold min(tokens, window). `tokens` unchanged for a model without such layers (or None)."""
    n_windowed = getattr(model, "windowed_layers", 0) if model is not None else 0
    if not n_windowed:
        return tokens
    share = n_windowed / model.n_layers
    t = np.asarray(tokens, float)
    return (1.0 - share) * t + share * np.minimum(t, float(model.sliding_window))


def windowed_per_layer(model, per_layer):
    """A (..., n_layers) array of tokens per KV head with each sliding-window layer capped at the window
    (e.g. a trace's kv_override mapped onto a model with sliding-window layers)."""
    arr = np.asarray(per_layer, float)
    if model is None or not getattr(model, "windowed_layers", 0) or arr.ndim < 1 or arr.shape[-1] != model.n_layers:
        return arr
    arr = arr.copy()
    layers = list(model.sliding_layers)
    arr[..., layers] = np.minimum(arr[..., layers], float(model.sliding_window))
    return arr


# --- one reader per HF model type: config dict -> ModelSpec keyword arguments ---

def _req(cfg: dict, *names: str):
    """First present, non-null field among `names` (HF renamed some fields across versions)."""
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    raise KeyError(" or ".join(names))


def _gpt2(c):  # also Cerebras-GPT
    d = _req(c, "n_embd", "hidden_size")
    return dict(n_layers=_req(c, "n_layer", "num_hidden_layers"), d_model=d, n_heads=_req(c, "n_head"),
                d_ff=c.get("n_inner") or 4 * d, vocab_size=_req(c, "vocab_size"), gated_mlp=False,
                tied=c.get("tie_word_embeddings", True), positional="learned",
                max_positions=_req(c, "n_positions", "n_ctx"))


def _gptj(c):
    d = _req(c, "n_embd", "hidden_size")
    return dict(n_layers=_req(c, "n_layer"), d_model=d, n_heads=_req(c, "n_head"), d_ff=c.get("n_inner") or 4 * d,
                vocab_size=_req(c, "vocab_size"), gated_mlp=False, tied=c.get("tie_word_embeddings", False),
                positional="rope", max_positions=_req(c, "n_positions"))


def _mpt(c):
    d = _req(c, "d_model")
    attn = c.get("attn_config") or {}
    heads = _req(c, "n_heads")
    kv_heads = attn.get("kv_n_heads") if attn.get("attn_type") in ("grouped_query_attention",) else None
    if attn.get("attn_type") == "multiquery_attention":
        kv_heads = 1
    return dict(n_layers=_req(c, "n_layers"), d_model=d, n_heads=heads, n_kv_heads=kv_heads or heads,
                d_ff=int(c.get("expansion_ratio", 4) * d), vocab_size=_req(c, "vocab_size"), gated_mlp=False,
                tied=c.get("tie_word_embeddings", True), positional="alibi" if attn.get("alibi", True) else "learned",
                max_positions=_req(c, "max_seq_len"))


def _llama(c):  # llama, mistral, qwen2: gated SiLU MLP, RoPE, optional GQA
    heads = _req(c, "num_attention_heads")
    return dict(n_layers=_req(c, "num_hidden_layers"), d_model=_req(c, "hidden_size"), n_heads=heads,
                n_kv_heads=c.get("num_key_value_heads") or heads, head_dim=c.get("head_dim"),
                d_ff=_req(c, "intermediate_size"), vocab_size=_req(c, "vocab_size"), gated_mlp=True,
                tied=c.get("tie_word_embeddings", False), positional="rope",
                max_positions=_req(c, "max_position_embeddings"))


def _mixtral(c):  # Mixtral: Mistral's attention, a top-k routed mixture of gated SiLU experts
    return dict(_llama(c), n_experts=_req(c, "num_local_experts"), experts_per_token=_req(c, "num_experts_per_tok"))


def _gemma(c):  # gemma, gemma2, gemma3_text: gated GeLU MLP, RoPE, GQA/MQA, tied embeddings by default
    return dict(_llama(c), tied=c.get("tie_word_embeddings", True))


def _gpt_neox(c):
    return dict(n_layers=_req(c, "num_hidden_layers"), d_model=_req(c, "hidden_size"),
                n_heads=_req(c, "num_attention_heads"), d_ff=_req(c, "intermediate_size"),
                vocab_size=_req(c, "vocab_size"), gated_mlp=False, tied=c.get("tie_word_embeddings", False),
                positional="rope", max_positions=_req(c, "max_position_embeddings"))


def _opt(c):
    return dict(n_layers=_req(c, "num_hidden_layers"), d_model=_req(c, "hidden_size"),
                n_heads=_req(c, "num_attention_heads"), d_ff=_req(c, "ffn_dim"), vocab_size=_req(c, "vocab_size"),
                gated_mlp=False, tied=c.get("tie_word_embeddings", True), positional="learned",
                max_positions=_req(c, "max_position_embeddings"))


def _falcon(c):
    # FalconConfig: the new decoder architecture (40B, 180B) has num_kv_heads KV heads; the old one (7B) is
    # multi-query (1 KV head) unless multi_query is false; the MLP is dense_h_to_4h (ffn_hidden_size or 4 x d);
    # attention and MLP run in parallel off one residual (the same ops as a sequential block)
    d = _req(c, "hidden_size")
    heads = _req(c, "num_attention_heads", "n_head")
    if c.get("new_decoder_architecture"):
        kv_heads = c.get("num_kv_heads") or heads
    else:
        kv_heads = 1 if c.get("multi_query", True) else heads
    return dict(n_layers=_req(c, "num_hidden_layers", "n_layer"), d_model=d, n_heads=heads, n_kv_heads=kv_heads,
                d_ff=c.get("ffn_hidden_size") or 4 * d, vocab_size=_req(c, "vocab_size"), gated_mlp=False,
                tied=c.get("tie_word_embeddings", True), positional="alibi" if c.get("alibi") else "rope",
                max_positions=c.get("max_position_embeddings", 2048))


def _bloom(c):
    d = _req(c, "hidden_size", "n_embed")
    # BLOOM has no max-position field (ALiBi extrapolates); it was trained at seq_length 2048.
    return dict(n_layers=_req(c, "n_layer", "num_hidden_layers"), d_model=d,
                n_heads=_req(c, "n_head", "num_attention_heads"),
                d_ff=4 * d, vocab_size=_req(c, "vocab_size"), gated_mlp=False, tied=c.get("tie_word_embeddings", True),
                positional="alibi", max_positions=c.get("seq_length", 2048))


_READERS = {"gpt2": _gpt2, "gptj": _gptj, "mpt": _mpt, "llama": _llama, "mistral": _llama, "mixtral": _mixtral,
            "qwen2": _llama, "qwen3": _llama, "gemma": _gemma, "gemma2": _gemma, "gemma3_text": _gemma, "gpt_neox": _gpt_neox,
            "opt": _opt, "bloom": _bloom, "falcon": _falcon}
SUPPORTED_TYPES = tuple(_READERS)


def spec_from_config(cfg: dict, name: str, where: str = "") -> ModelSpec:
    """Build a ModelSpec from an HF config dict; ValueError naming the file and field otherwise."""
    where = where or name
    model_type = cfg.get("model_type")
    if model_type not in _READERS:
        raise ValueError(f"{where}: unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_TYPES)}")
    try:
        kw = _READERS[model_type](cfg)
    except KeyError as missing:
        raise ValueError(f"{where}: missing field {missing.args[0]} for model_type {model_type!r}") from None
    limit = kw["max_positions"]     # 0 or a negative limit would silently mean "no context limit"
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"{where}: the context length (max_position_embeddings, or n_positions / max_seq_len / "
                         f"seq_length for model_type {model_type!r}) must be a positive integer, got {limit!r}")
    n_heads, d_model = kw["n_heads"], kw["d_model"]
    head_dim = kw.pop("head_dim", None)
    if head_dim is None and isinstance(d_model, int) and isinstance(n_heads, int) and n_heads > 0:
        if d_model % n_heads:
            raise ValueError(f"{where}: hidden size {d_model} is not divisible by {n_heads} heads "
                             "and the config gives no head_dim")
        head_dim = d_model // n_heads
    return ModelSpec(name=name, model_type=model_type, n_layers=kw["n_layers"], d_model=d_model, n_heads=n_heads,
                     n_kv_heads=kw.get("n_kv_heads") or n_heads, head_dim=head_dim, d_ff=kw["d_ff"],
                     vocab_size=kw["vocab_size"], gated_mlp=kw["gated_mlp"], tied_embeddings=bool(kw["tied"]),
                     positional=kw["positional"], max_positions=kw["max_positions"], source=cfg.get("_source", where),
                     sliding_window=_window(cfg.get("sliding_window")),
                     sliding_layers=_sliding_layers(cfg, model_type, kw["n_layers"], where),
                     n_experts=kw.get("n_experts", 1), experts_per_token=kw.get("experts_per_token", 1))


def _window(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _sliding_layers(cfg: dict, model_type: str, n_layers: int, where: str) -> tuple[int, ...]:
    """Indices of the layers that apply the config's sliding window, as transformers builds its caches:
    the config's `layer_types` when it lists them; else Mistral: every layer; Gemma 2: the even layers;
    Gemma 3: all but every 6th (`sliding_window_pattern`); Qwen2: layers from
    `max_window_layers` on, only with `use_sliding_window`; other model types: none."""
    if _window(cfg.get("sliding_window")) is None or not isinstance(n_layers, int):
        return ()
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n_layers:
            raise ValueError(f"{where}: layer_types lists {len(types)} layers for {n_layers} hidden layers")
        return tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if model_type in ("mistral", "mixtral"):
        return tuple(range(n_layers))
    if model_type == "gemma2":       # transformers' Gemma2Config: even layers local, odd layers global
        return tuple(i for i in range(n_layers) if i % 2 == 0)
    if model_type == "gemma3_text":  # Gemma3TextConfig: every sliding_window_pattern-th layer global (6)
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return tuple(i for i in range(n_layers) if (i + 1) % pattern)
    if model_type in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        return tuple(range(min(int(cfg.get("max_window_layers") or 0), n_layers), n_layers))
    return ()


def load_model(name_or_path) -> ModelSpec:
    """A shipped name (see list_models()), a path to an HF config.json, a folder holding one, or a published /
    Hugging Face name of a shipped spec (sim.model_names)."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    key = str(name_or_path)
    shipped = MODELS_DIR / f"{key.lower()}.json"
    path = shipped if shipped.is_file() and "/" not in key else Path(key).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        # not a shipped spec nor a file: a published or Hugging Face name ("meta-llama/Llama-3.1-70B-Instruct")
        # of a shipped spec (sim/models/names.yaml), else the error that names what was tried
        resolved = None if path.exists() or key.endswith(".json") or key.startswith(("/", ".", "~")) else resolve_name(key)
        if resolved is not None and resolved.spec is not None:
            return load_model(resolved.spec)
        if resolved is None:
            raise FileNotFoundError(f"model config {path} not found")
        raise ValueError(f"unknown model {key!r}: {resolved.reason}")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object")
    name = path.stem if path == shipped else (path.parent.name if path.name == "config.json" else path.stem)
    return spec_from_config(cfg, name=name, where=str(path))
