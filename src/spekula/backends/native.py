"""Native PyTorch runner for the Llama family (Llama, Qwen2, Mistral, SmolLM2), gpt-fast style.

The whole model is this file: RoPE, one transformer Block, and a KV cache per sequence where
rollback is moving a pointer. Weights and their shapes (ModelArgs) come from native_loader (Hugging
Face safetensors directories or GGUF files).

Shapes: T = tokens in one packed forward (all sequences together), S = one sequence's new tokens,
L = keys attended (cached prefix + S), H / Hkv = query / key-value heads, hd = head dim, D = model dim.

A forward is *packed*: the new tokens of every sequence in the batch are concatenated into one
[T, D] matrix, so every linear layer (the cost on a CPU) runs once for the whole batch; attention
then runs per sequence against that sequence's own cache (no padding, no cross-sequence mask).

KV cache of one sequence: [n_layers, 2 (k, v), Hkv, capacity, hd]. Slot i holds position i. The
cache holds valid keys for slots < length; `truncate` only lowers length (the Sequence base class
keeps `tokens`), so stale slots past it are never attended and are overwritten by the next forward.
Capacity grows on demand (doubling, copied once) up to max_cache_len.

Weights: fp32 on a CPU, every Linear runs on a oneDNN-packed copy (layout "packed", the default
there), which verifies a block of tokens for little more than one token costs; elsewhere weights
stay as checkpoints store them ([out, in], row-major).

Every shape follows the block, so nothing here is captured as a CUDA graph. A static-shape mode for
torch.compile (blocks padded to fixed sizes, caches at fixed addresses) lived here untested on a GPU
and was taken out until it can be; git history has it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from spekula.backends.base import Backend, Capabilities, Sequence
from spekula.backends.native_loader import ModelArgs
from spekula.config import BackendConfig
from spekula.errors import ConfigError, ModelError
from spekula.limits import check_forward, check_token_ids

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LAYOUTS = ("auto", "packed", "rows")
CACHE_CHUNK = 256  # cache capacity grows in multiples of this many slots


# -- RoPE (rotate-half convention, as in Hugging Face checkpoints) --------------------------------


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [hd / 2] in fp32, computed exactly as transformers does."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = args.rope_scaling or {"rope_type": "default"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_context / high) * ~(wavelen > old_context / low)
        return torch.where(medium, smoothed, scaled)
    raise ModelError(f"the native runner does not implement RoPE scaling {kind!r}; use the transformers backend")


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = positions[:, None].float() * inv_freq  # [T, hd / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, hd]; cos, sin: [T, hd]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


# -- the model ------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalised in fp32, then scaled in the model's dtype (what the checkpoints were trained with).
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Linear(nn.Linear):
    """nn.Linear that runs on oneDNN's packed copy of its weight when it has one (layout="packed").

    Otherwise, for several rows in fp32 on a CPU, it computes x @ W^T as (W @ x^T)^T: MKL is faster
    with the big weight as the untransposed operand (scripts/pass_costs.py --runtime native measures
    the pass costs). One row stays a plain matrix-vector product, and bf16 stays on F.linear (oneDNN).
    """

    packed: torch.Tensor | None = None  # set by use_packed_weights; then `weight` is an empty placeholder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        w = self.weight
        if x.shape[0] == 1 or w.dtype != torch.float32 or w.device.type != "cpu" or not w.is_contiguous():
            return F.linear(x, w, self.bias)
        y = torch.mm(w, x.t()) if self.bias is None else torch.addmm(self.bias[:, None], w, x.t())  # [out, T]
        return y.t().contiguous()  # [T, out]


@dataclass
class Segment:
    """One sequence's share of a packed forward."""

    cache: torch.Tensor  # [n_layers, 2, Hkv, capacity, hd]
    rows: slice  # its rows in the packed [T, ...] tensors (S of them)
    slots: torch.Tensor  # [S] long: the cache slots its new keys go to
    kv_len: int  # attend to cache slots [0, kv_len)
    mask: torch.Tensor | None  # [S, kv_len] bool, True = may attend; None = every slot < kv_len
    window_masks: dict[int, torch.Tensor | None] = field(default_factory=dict)  # sliding window -> mask


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.window = args.window(layer)
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        qkv_dim = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
        self.wqkv = Linear(args.dim, qkv_dim, bias=args.qkv_bias)  # q, k and v in one matmul
        self.wo = Linear(args.n_heads * args.head_dim, args.dim, bias=args.o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        T = x.shape[0]
        H, Hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.wqkv(x)  # [T, (H + 2 Hkv) * hd]
        qk = apply_rope(qkv[:, : (H + Hkv) * hd].view(T, H + Hkv, hd), cos, sin)  # [T, H + Hkv, hd]
        q, k = qk.split([H, Hkv], dim=1)  # [T, H, hd], [T, Hkv, hd]
        v = qkv[:, (H + Hkv) * hd :].view(T, Hkv, hd)  # [T, Hkv, hd]
        out = torch.empty_like(q)  # [T, H, hd]
        for seg in segments:
            k_cache, v_cache = seg.cache[self.layer]  # [Hkv, capacity, hd] each
            k_cache.index_copy_(1, seg.slots, k[seg.rows].transpose(0, 1))
            v_cache.index_copy_(1, seg.slots, v[seg.rows].transpose(0, 1))
            mask = seg.mask if self.window is None else seg.window_masks[self.window]
            out[seg.rows] = attend(q[seg.rows], k_cache[:, : seg.kv_len], v_cache[:, : seg.kv_len], mask)
        return self.wo(out.view(T, H * hd))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention of one sequence: q [S, H, hd], k and v [Hkv, L, hd], mask [S, L] -> [S, H, hd].

    4-D inputs and enable_gqa keep SDPA on its fused CPU kernel, and no key is repeated or copied.
    """
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1)  # [S, H, hd]


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w13 = Linear(args.dim, 2 * args.hidden_dim, bias=args.mlp_bias)  # gate and up in one matmul
        self.w2 = Linear(args.hidden_dim, args.dim, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)  # [T, hidden] each
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, layer)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, segments)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    inv_freq: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, i) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)  # [hd / 2] fp32, not a weight

    @classmethod
    def from_state_dict(cls, args: ModelArgs, weights: dict[str, torch.Tensor]) -> Transformer:
        """Build without initialising anything (weights are taken over, not copied)."""
        with torch.device("meta"):
            model = cls(args)
        if args.tie_embeddings:
            weights = {k: v for k, v in weights.items() if k != "output.weight"}
        model.load_state_dict(weights, strict=not args.tie_embeddings, assign=True)
        if args.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
        model.inv_freq = rope_inv_freq(args)  # built on the meta device above
        return model.eval()

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, segments: list[Segment], logit_rows: torch.Tensor
    ) -> torch.Tensor:
        # tokens, positions: [T] long; logit_rows: [N] long -> float32 logits [N, V]
        x = self.tok_embeddings(tokens)  # [T, D]
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)  # [T, hd] each
        for layer in self.layers:
            x = layer(x, cos, sin, segments)
        x = self.norm(x.index_select(0, logit_rows))  # [N, D]: the head runs only where logits are wanted
        return self.output(x).float()  # [N, V]


def use_packed_weights(model: Transformer, rows_hint: int = 16) -> None:
    """Give every fp32 Linear a oneDNN-packed copy of its weight (CPU) and drop the plain one.

    This is what makes verification cheap on a CPU: MKL's x @ W^T is slow for the few rows of a
    verify block, oneDNN's packed product is not (`scripts/pass_costs.py --runtime native` measures
    a pass of 1..K+1 tokens; docs/BENCHMARKS.md, packed fp32, has the figures).
    rows_hint: the block width oneDNN chooses its blocking for. A verify block has up to k_max + 1
    rows (SpecConfig.k_max); whether the hint must match that width is not measured.
    A tied output head keeps the plain weight, which the embedding lookup still reads.
    """
    for module in model.modules():
        if isinstance(module, Linear) and module.packed is None:  # a model shared by two backends is packed once
            module.packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), rows_hint)
            if not (model.args.tie_embeddings and module is model.output):
                module.weight = nn.Parameter(torch.empty(0), requires_grad=False)


def attention_mask(
    start: int, depth: torch.Tensor, kv_len: int, block_mask: torch.Tensor | None, window: int | None
) -> torch.Tensor | None:
    """Which cache slots each new token (written at slots start .. start + S - 1) may attend.

    depth: [S] each new token's offset from start in positions (0 .. S-1 when causal; tree depth).
    Returns [S, kv_len] bool, or None when every token may attend every slot < kv_len (one causal
    token, no window: plain decoding's fast path). The cached prefix is always visible; within the
    block, `block_mask` [S, S] decides (default: causal). A sliding window counts positions, not slots.
    """
    size = depth.shape[0]
    if window is not None and start + size <= window:
        window = None  # the whole sequence fits in the window
    if block_mask is None and window is None and size == 1 and kv_len == start + 1:
        return None
    query = torch.arange(start, start + size)[:, None]  # [S, 1] the query's own slot
    slot = torch.arange(kv_len)[None, :]  # [1, kv_len]
    mask = slot <= query  # causal over slots
    if block_mask is not None:
        mask[:, start : start + size] = block_mask
    if window is not None:
        key_position = torch.arange(kv_len)
        key_position[start : start + size] = start + depth
        mask &= key_position[None, :] > (start + depth)[:, None] - window
    return mask


# -- the backend ----------------------------------------------------------------------------------


class NativeBackend(Backend):
    capabilities = Capabilities(batching=True, tree_mask=True)

    def __init__(
        self,
        model: Transformer,
        name: str = "model",
        config: BackendConfig = BackendConfig(),
        eos_token_ids: Seq[int] = (),
        *,
        max_cache_len: int | None = None,
        layout: str = "auto",
    ) -> None:
        """max_cache_len: most tokens one sequence may hold (default: the model's context).
        layout: "packed" (oneDNN blocked weights, fp32 on a CPU: see use_packed_weights), "rows" (as
        stored) or "auto" (packed where it applies, else rows).
        """
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
        self.model = model
        self.args = model.args
        self.name = name
        self.config = config
        self.vocab_size = model.args.vocab_size
        self.context_length = min(model.args.max_seq_len, max_cache_len or model.args.max_seq_len)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.dtype = model.tok_embeddings.weight.dtype
        self.device = model.tok_embeddings.weight.device
        packable = self.device.type == "cpu" and self.dtype == torch.float32 and torch.backends.mkldnn.is_available()
        if layout == "packed" and not packable:
            raise ConfigError("layout='packed' needs fp32 weights on a CPU with oneDNN; use layout='rows'")
        self.layout = "packed" if layout == "auto" and packable else ("rows" if layout == "auto" else layout)
        if self.layout == "packed":
            use_packed_weights(model)

    @classmethod
    def load(
        cls,
        path: str | Path,
        name: str | None = None,
        config: BackendConfig = BackendConfig(),
        device: str = "cpu",
        **kw,
    ) -> NativeBackend:
        """A Hugging Face directory or a .gguf file; keyword arguments as for the constructor."""
        from spekula.backends.native_loader import load_weights

        if config.threads:
            torch.set_num_threads(config.threads)  # process-wide: torch has no per-model thread pool
        loaded = load_weights(Path(path), TORCH_DTYPES[config.dtype])
        model = Transformer.from_state_dict(loaded.args, loaded.weights).to(device)
        return cls(model, name or Path(path).stem, config, loaded.eos_token_ids, **kw)

    def new_sequence(self) -> NativeSequence:
        return NativeSequence(self)

    def describe(self) -> dict:
        dtype = str(self.dtype).removeprefix("torch.")
        return {**super().describe(), "dtype": dtype, "layout": self.layout}

    @torch.inference_mode()
    def forward_batch(
        self,
        sequences: Seq[NativeSequence],
        token_lists: Seq[Seq[int]],
        num_logits: Seq[int | None] | None = None,
        block_masks: Seq[torch.Tensor | None] | None = None,
    ) -> list[torch.Tensor]:
        """One forward over several sequences, each appending its own tokens at its own positions.

        Returns, per sequence, float32 logits [num_logits, V] for its last num_logits new tokens
        (all of them if None). block_masks: per sequence None (causal) or [S, S] bool over its new
        tokens; a token's position is then its depth, length + (row sum - 1), as in token trees.
        """
        n = len(sequences)
        num_logits = [None] * n if num_logits is None else list(num_logits)
        block_masks = [None] * n if block_masks is None else list(block_masks)
        if not n == len(token_lists) == len(num_logits) == len(block_masks):
            raise ValueError("forward_batch needs one token list, num_logits and block mask per sequence")
        if len({id(s) for s in sequences}) != n:
            raise ValueError("a sequence appears twice in one batch")

        tokens: list[int] = []
        logit_rows: list[int] = []
        positions, segments, counts = [], [], []
        for seq, ids, wanted, block_mask in zip(sequences, token_lists, num_logits, block_masks, strict=True):
            ids = [int(t) for t in ids]
            wanted = len(ids) if wanted is None else wanted
            self._check(seq, ids, wanted, block_mask)
            segment, depth = self._segment(seq, ids, block_mask, row=len(tokens))
            logit_rows.extend(range(segment.rows.stop - wanted, segment.rows.stop))
            tokens.extend(ids)
            positions.append(seq.length + depth)
            segments.append(segment)
            counts.append(wanted)

        inputs = (torch.tensor(tokens, device=self.device), torch.cat(positions).to(self.device), segments)
        logits = self.model(*inputs, torch.tensor(logit_rows, device=self.device))
        logits = logits.cpu()  # [sum(num_logits), V]; the engine verifies and samples on the CPU
        for seq, ids in zip(sequences, token_lists, strict=True):
            seq.tokens.extend(int(t) for t in ids)
        return list(logits.split(counts))

    def _segment(
        self, seq: NativeSequence, ids: list[int], block_mask: torch.Tensor | None, row: int
    ) -> tuple[Segment, torch.Tensor]:
        """Plan one sequence's share of the forward: cache room, slots, masks.

        Returns the segment and the new tokens' depths [S] (position - length).
        """
        S, start = len(ids), seq.length
        seq.reserve(start + S)
        if block_mask is not None:
            block_mask = block_mask.to(torch.bool)
            depth = block_mask.sum(-1) - 1  # [S] tree depth of each node; = 0..S-1 when causal
        else:
            depth = torch.arange(S)
        kv_len = start + S
        assert seq.cache is not None  # reserve() allocated it
        segment = Segment(
            cache=seq.cache,
            rows=slice(row, row + S),
            slots=torch.arange(start, start + S, device=self.device),
            kv_len=kv_len,
            mask=_to(attention_mask(start, depth, kv_len, block_mask, None), self.device),
        )
        for window in {w for w in self.args.sliding_window if w is not None}:
            segment.window_masks[window] = _to(attention_mask(start, depth, kv_len, block_mask, window), self.device)
        return segment, depth

    def _check(self, seq: NativeSequence, ids: list[int], wanted: int, block_mask: torch.Tensor | None) -> None:
        if seq.backend is not self:
            raise ValueError("the sequence belongs to another backend")
        S = len(ids)
        check_forward(seq.length, S, self.context_length)
        if not 1 <= wanted <= S:
            raise ValueError(f"num_logits must be in [1, {S}], got {wanted}")
        check_token_ids(ids, self.vocab_size)
        if block_mask is not None:
            if tuple(block_mask.shape) != (S, S):
                raise ValueError(f"block_mask must be [{S}, {S}] for {S} new tokens, got {list(block_mask.shape)}")
            if not bool(block_mask.to(torch.bool).diagonal().all()):
                raise ValueError("block_mask must let every token see itself (a True diagonal)")


def _to(mask: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if mask is None else mask.to(device)


class NativeSequence(Sequence):
    """One sequence's KV cache; `length` (= len(tokens)) is the pointer rollback moves."""

    def __init__(self, backend: NativeBackend) -> None:
        super().__init__(backend.context_length)
        self.backend = backend
        self.capacity_limit = backend.context_length
        self.cache: torch.Tensor | None = None  # [n_layers, 2, Hkv, capacity, hd], allocated on first use

    def forward(
        self, token_ids: Seq[int], num_logits: int | None = None, block_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sequence.forward, plus an optional [S, S] mask over the new tokens (see forward_batch)."""
        return self.backend.forward_batch([self], [token_ids], [num_logits], [block_mask])[0]

    def _forward(self, token_ids: list[int], num_logits: int, block_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward(token_ids, num_logits, block_mask)

    def _truncate(self, length: int) -> None:
        pass  # slots >= length are stale: never attended, overwritten by the next forward

    def release(self) -> None:
        self.cache = None
        self.tokens.clear()

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else self.cache.shape[3]

    def reserve(self, slots: int) -> None:
        """Make room for `slots` cache slots: allocate, or grow (doubling) keeping the valid prefix."""
        if slots <= self.capacity:
            return
        args, backend = self.backend.args, self.backend
        capacity = max(slots, 2 * self.capacity, CACHE_CHUNK)
        capacity = min(-(-capacity // CACHE_CHUNK) * CACHE_CHUNK, self.capacity_limit)
        if slots > capacity:
            raise ConfigError(f"{slots} cache slots exceed the limit of {self.capacity_limit}")
        shape = (args.n_layers, 2, args.n_kv_heads, capacity, args.head_dim)
        cache = torch.zeros(shape, dtype=backend.dtype, device=backend.device)
        if self.cache is not None:
            cache[:, :, :, : self.length] = self.cache[:, :, :, : self.length]
        self.cache = cache
