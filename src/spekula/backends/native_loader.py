"""Weights for the native runner: a Hugging Face directory or a GGUF file -> ModelArgs + state dict.

Both formats go through one table of tensor names (`HF_NAMES`, `GGUF_NAMES`) and one assembly
step that fuses q/k/v into `wqkv` and gate/up into `w13` (one matmul each in native.py).

GGUF tensors are dequantised to fp32 by the `gguf` package (as transformers does), then cast to
the requested dtype; llama.cpp stores the q and k projections of `llama` models with their rows
permuted for its interleaved RoPE, which is undone here. Loading the converted Hugging Face
directory (what `spekula.models.resolve` always provides) is faster and is the default path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from spekula.errors import ModelError

ARCHITECTURES = ("llama", "mistral", "qwen2")  # model_type in config.json; GGUF general.architecture


@dataclass(frozen=True)
class ModelArgs:
    """The shape of a model, as native.py's Transformer is built from it (read from config.json or GGUF)."""

    vocab_size: int
    dim: int  # D
    n_layers: int
    n_heads: int  # H
    n_kv_heads: int  # Hkv (grouped-query attention when < H)
    head_dim: int  # hd
    hidden_dim: int  # MLP intermediate size
    norm_eps: float
    max_seq_len: int  # max_position_embeddings
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear" | "llama3", ...}; None = plain RoPE
    qkv_bias: bool = False  # Qwen2
    o_bias: bool = False
    mlp_bias: bool = False
    tie_embeddings: bool = False  # output layer = token embedding (SmolLM2)
    sliding_window: tuple[int | None, ...] = ()  # per layer (Mistral, some Qwen2); () = none anywhere

    def window(self, layer: int) -> int | None:
        return self.sliding_window[layer] if self.sliding_window else None


# role -> source tensor name; {i} = layer, {p} = weight | bias
HF_NAMES = {
    "embed": "model.embed_tokens.weight",
    "norm": "model.norm.weight",
    "output": "lm_head.weight",
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "q": "model.layers.{i}.self_attn.q_proj.{p}",
    "k": "model.layers.{i}.self_attn.k_proj.{p}",
    "v": "model.layers.{i}.self_attn.v_proj.{p}",
    "o": "model.layers.{i}.self_attn.o_proj.{p}",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "gate": "model.layers.{i}.mlp.gate_proj.{p}",
    "up": "model.layers.{i}.mlp.up_proj.{p}",
    "down": "model.layers.{i}.mlp.down_proj.{p}",
}
GGUF_NAMES = {
    "embed": "token_embd.weight",
    "norm": "output_norm.weight",
    "output": "output.weight",
    "attn_norm": "blk.{i}.attn_norm.weight",
    "q": "blk.{i}.attn_q.{p}",
    "k": "blk.{i}.attn_k.{p}",
    "v": "blk.{i}.attn_v.{p}",
    "o": "blk.{i}.attn_output.{p}",
    "ffn_norm": "blk.{i}.ffn_norm.weight",
    "gate": "blk.{i}.ffn_gate.{p}",
    "up": "blk.{i}.ffn_up.{p}",
    "down": "blk.{i}.ffn_down.{p}",
}

Getter = Callable[[str], "torch.Tensor | None"]  # source tensor name -> fp32 or checkpoint-dtype tensor, None if absent


@dataclass
class LoadedWeights:
    args: ModelArgs
    weights: dict[str, torch.Tensor]  # native names (see native.Transformer), in the requested dtype
    eos_token_ids: tuple[int, ...]


def load_weights(path: Path, dtype: torch.dtype) -> LoadedWeights:
    """A Hugging Face model directory or a .gguf file."""
    path = Path(path)
    if path.is_dir():
        return load_hf_dir(path, dtype)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return load_gguf(path, dtype)
    raise ModelError(f"{path} is neither a Hugging Face model directory nor a .gguf file")


# -- Hugging Face directories ---------------------------------------------------------------------


def args_from_hf_config(cfg: dict) -> ModelArgs:
    kind = cfg.get("model_type")
    if kind not in ARCHITECTURES:
        raise ModelError(
            f"the native runner supports {', '.join(ARCHITECTURES)} models, not {kind!r}; use --backend transformers"
        )
    heads = cfg["num_attention_heads"]
    rope = dict(cfg.get("rope_parameters") or {})  # transformers 5; older configs: rope_theta + rope_scaling
    theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
    scaling = rope if rope.get("rope_type", "default") != "default" else cfg.get("rope_scaling")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelError("partial rotary embeddings are not supported by the native runner")
    return ModelArgs(
        vocab_size=cfg["vocab_size"],
        dim=cfg["hidden_size"],
        n_layers=cfg["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        hidden_dim=cfg["intermediate_size"],
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        max_seq_len=cfg.get("max_position_embeddings") or 4096,
        rope_theta=float(theta),
        rope_scaling=scaling or None,
        qkv_bias=kind == "qwen2" or bool(cfg.get("attention_bias", False)),
        o_bias=kind == "llama" and bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=_sliding_windows(kind, cfg),
    )


def _sliding_windows(kind: str, cfg: dict) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if window is None or kind == "llama":
        return ()
    n = cfg["num_hidden_layers"]
    if kind == "mistral":
        return (window,) * n
    if not cfg.get("use_sliding_window", False):  # qwen2: off unless asked for
        return ()
    types = cfg.get("layer_types") or [
        "sliding_attention" if i >= cfg.get("max_window_layers", n) else "full_attention" for i in range(n)
    ]
    return tuple(window if t == "sliding_attention" else None for t in types)


def load_hf_dir(path: Path, dtype: torch.dtype) -> LoadedWeights:
    from safetensors import safe_open

    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{path} has no config.json: not a Hugging Face model directory")
    cfg = json.loads(config_file.read_text())
    cfg = cfg.get("text_config", cfg) if cfg.get("model_type") not in ARCHITECTURES else cfg
    args = args_from_hf_config(cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path} has no *.safetensors files (the native runner reads safetensors only)")
    handles = [safe_open(str(f), framework="pt") for f in files]
    where = {name: h for h in handles for name in h.keys()}

    def get(name: str) -> torch.Tensor | None:
        return where[name].get_tensor(name) if name in where else None

    eos: set[int] = set()
    for source in (path / "generation_config.json", config_file):
        if source.is_file():
            eos.update(_ids(json.loads(source.read_text()).get("eos_token_id")))
    return LoadedWeights(args, assemble(get, HF_NAMES, args, dtype), tuple(sorted(eos)))


def _ids(value) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else []


# -- GGUF -----------------------------------------------------------------------------------------


def load_gguf(path: Path, dtype: torch.dtype) -> LoadedWeights:
    from gguf import GGUFReader, quants

    reader = GGUFReader(str(path))

    def field(key: str, default=None):
        return reader.fields[key].contents() if key in reader.fields else default

    arch = field("general.architecture")
    if arch not in ("llama", "qwen2"):  # Mistral GGUFs say "llama"
        raise ModelError(f"the native runner reads llama and qwen2 GGUF files, not {arch!r}; use the llama.cpp backend")
    tensors = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in tensors or field(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise ModelError(f"{path.name} uses scaled RoPE; load its Hugging Face directory instead")
    heads = field(f"{arch}.attention.head_count")
    kv_heads = field(f"{arch}.attention.head_count_kv", heads)
    dim = field(f"{arch}.embedding_length")
    embed = tensors["token_embd.weight"]
    args = ModelArgs(
        vocab_size=int(embed.shape[-1]),  # GGUF shapes are listed innermost first: [D, V]
        dim=dim,
        n_layers=field(f"{arch}.block_count"),
        n_heads=heads,
        n_kv_heads=kv_heads,
        head_dim=field(f"{arch}.attention.key_length", dim // heads),
        hidden_dim=field(f"{arch}.feed_forward_length"),
        norm_eps=field(f"{arch}.attention.layer_norm_rms_epsilon"),
        max_seq_len=field(f"{arch}.context_length", 4096),
        rope_theta=float(field(f"{arch}.rope.freq_base", 10000.0)),
        qkv_bias="blk.0.attn_q.bias" in tensors,
        o_bias="blk.0.attn_output.bias" in tensors,
        mlp_bias="blk.0.ffn_up.bias" in tensors,
        tie_embeddings="output.weight" not in tensors,
    )

    def get(name: str) -> torch.Tensor | None:
        if name not in tensors:
            return None
        t = tensors[name]
        w = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)  # [out, in] fp32
        if arch == "llama" and name.endswith(".weight") and (".attn_q." in name or ".attn_k." in name):
            w = unpermute(w, heads if ".attn_q." in name else kv_heads)
        return torch.from_numpy(w)

    eos = field("tokenizer.ggml.eos_token_id")
    return LoadedWeights(args, assemble(get, GGUF_NAMES, args, dtype), () if eos is None else (int(eos),))


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert-time row permutation of q/k (interleaved -> rotate-half RoPE)."""
    rows = w.shape[0] // n_head // 2
    return w.reshape(n_head, rows, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


# -- one assembly for both formats ----------------------------------------------------------------


def assemble(get: Getter, names: dict[str, str], args: ModelArgs, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Source tensors -> native state dict: renamed, q/k/v and gate/up fused, cast to dtype."""

    def take(role: str, layer: int | None = None, part: str = "weight") -> torch.Tensor:
        name = names[role].format(i=layer, p=part)
        tensor = get(name)
        if tensor is None:
            raise ModelError(f"the checkpoint has no tensor {name!r}; it is not a complete {role} layer")
        return tensor.to(dtype)

    def fuse(roles: tuple[str, ...], layer: int, part: str = "weight") -> torch.Tensor:
        return torch.cat([take(r, layer, part) for r in roles])

    weights = {"tok_embeddings.weight": take("embed"), "norm.weight": take("norm")}
    if not args.tie_embeddings:
        weights["output.weight"] = take("output")
    for i in range(args.n_layers):
        p = f"layers.{i}."
        weights[p + "attention_norm.weight"] = take("attn_norm", i)
        weights[p + "attention.wqkv.weight"] = fuse(("q", "k", "v"), i)  # [(H + 2 Hkv) hd, D]
        weights[p + "attention.wo.weight"] = take("o", i)
        weights[p + "ffn_norm.weight"] = take("ffn_norm", i)
        weights[p + "feed_forward.w13.weight"] = fuse(("gate", "up"), i)  # [2 hidden, D]
        weights[p + "feed_forward.w2.weight"] = take("down", i)
        if args.qkv_bias:
            weights[p + "attention.wqkv.bias"] = fuse(("q", "k", "v"), i, "bias")
        if args.o_bias:
            weights[p + "attention.wo.bias"] = take("o", i, "bias")
        if args.mlp_bias:
            weights[p + "feed_forward.w13.bias"] = fuse(("gate", "up"), i, "bias")
            weights[p + "feed_forward.w2.bias"] = take("down", i, "bias")
    return weights
