"""The native runner against transformers on tiny random-weight models built in memory (fp32, fast).

The reference for every logit row is one plain transformers forward over the whole prefix (no
cache), so caching, rollback, padding, batching and tree masks are all checked against the same
ground truth.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spekula.backends import load_backend
from spekula.backends.hf import TransformersBackend
from spekula.backends.native import CACHE_CHUNK, NativeBackend, Transformer
from spekula.backends.native_loader import args_from_hf_config, load_weights
from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.errors import ConfigError, ModelError
from spekula.limits import ContextExceeded, OutOfVocabulary
from spekula.proposers import DraftModelFactory

VOCAB = 96
ATOL = 1e-5  # tiny models: logits ~1, fp32 rounding ~1e-7
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=640,
    rms_norm_eps=1e-5,
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _build(kind: str):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed({"llama": 0, "qwen2": 1, "mistral": 2}[kind])
    if kind == "llama":  # SmolLM2-like: tied embeddings, grouped-query attention
        model = LlamaForCausalLM(LlamaConfig(**COMMON, tie_word_embeddings=True))
    elif kind == "qwen2":  # q/k/v bias, separate output layer, large rope theta
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON, rope_theta=1e6, tie_word_embeddings=False))
    else:  # a short sliding window, so the window mask matters
        model = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=8, head_dim=16))
    with torch.no_grad():  # random init leaves biases and norms at 0 / 1: make every tensor count
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.5)
    return model.eval()


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def pair(request, tmp_path_factory):
    """(native backend, reference transformers model, directory) for one tiny architecture."""
    path = tmp_path_factory.mktemp(request.param)
    model = _build(request.param)
    model.save_pretrained(path)
    return NativeBackend.load(path), model, path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-only")
    model = _build("llama")
    model.save_pretrained(path)
    return NativeBackend.load(path), model, path


@torch.inference_mode()
def reference(model, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0].float()  # [len, V]


def tokens(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def close(actual, expected, atol=ATOL):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# -- logits -----------------------------------------------------------------------------------------


def test_prefill_decode_and_blocks_match_transformers(pair):
    native, model, _ = pair
    ids = tokens(40)
    seq = native.new_sequence()
    close(seq.forward(ids[:12]), reference(model, ids[:12]))  # prefill, every position
    close(seq.forward(ids[12:13]), reference(model, ids[:13])[-1:])  # one decode step
    for a, b in [(13, 15), (15, 20), (20, 29)]:  # blocks of 2, 5 and 9 (k + 1 for k = 1, 4, 8)
        close(seq.forward(ids[a:b]), reference(model, ids[:b])[a:])
    assert seq.tokens == ids[:29] and seq.length == 29


def test_num_logits_returns_the_last_rows(pair):
    native, model, _ = pair
    ids = tokens(10, seed=1)
    out = native.new_sequence().forward(ids, num_logits=3)
    assert out.shape == (3, VOCAB) and out.dtype == torch.float32
    close(out, reference(model, ids)[-3:])


def test_rollback_then_reforward_equals_a_fresh_prefill(pair):
    native, model, _ = pair
    ids = tokens(20, seed=2)
    seq = native.new_sequence()
    seq.forward(ids[:12])
    seq.forward([5, 6, 7, 8, 9])  # a rejected draft
    seq.truncate(13)
    assert seq.tokens == ids[:12] + [5]
    rolled = seq.forward([ids[13], ids[14]])
    close(rolled, reference(model, ids[:12] + [5, ids[13], ids[14]])[-2:])
    seq.truncate(0)
    close(seq.forward(ids[:4]), reference(model, ids[:4]))


def test_cache_grows_past_its_first_allocation(pair):
    native, model, _ = pair
    ids = tokens(CACHE_CHUNK + 60, seed=3)
    seq = native.new_sequence()
    seq.forward(ids[: CACHE_CHUNK - 3])
    assert seq.capacity == CACHE_CHUNK
    out = seq.forward(ids[CACHE_CHUNK - 3 :])  # crosses the boundary: the cache is copied into a larger one
    assert seq.capacity == 2 * CACHE_CHUNK
    close(out, reference(model, ids)[CACHE_CHUNK - 3 :], atol=2e-5)
    seq.release()
    assert seq.cache is None and seq.length == 0


# -- masks over the block (token trees) ------------------------------------------------------------


def test_causal_block_mask_equals_the_default(pair):
    native, _, _ = pair
    ids = tokens(16, seed=4)
    a, b = native.new_sequence(), native.new_sequence()
    a.forward(ids[:10])
    b.forward(ids[:10])
    close(a.forward(ids[10:]), b.forward(ids[10:], block_mask=torch.ones(6, 6, dtype=torch.bool).tril()))


TREE_PARENTS = [-1, 0, 0, 1, 1, 2]  # root; two children; two grandchildren under the first child
TREE_TOKENS = [11, 22, 33, 44, 55, 66]


def tree_mask(parents: list[int]) -> torch.Tensor:
    mask = torch.eye(len(parents), dtype=torch.bool)  # [S, S]: each node sees itself and its ancestors
    for i, p in enumerate(parents):
        while p >= 0:
            mask[i, p] = True
            p = parents[p]
    return mask


def tree_path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(TREE_TOKENS[node])
        node = parents[node]
    return path[::-1]


def test_tree_mask_scores_every_branch_as_its_own_sequence(pair):
    native, model, _ = pair
    prefix = tokens(9, seed=5)
    seq = native.new_sequence()
    seq.forward(prefix)
    out = seq.forward(TREE_TOKENS, block_mask=tree_mask(TREE_PARENTS))  # [6, V]
    for node in range(len(TREE_TOKENS)):
        expected = reference(model, prefix + tree_path(TREE_PARENTS, node))[-1]
        close(out[node], expected)


def test_block_mask_is_checked(llama):
    native, _, _ = llama
    seq = native.new_sequence()
    with pytest.raises(ValueError, match="block_mask must be"):
        seq.forward([1, 2, 3], block_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="see itself"):
        seq.forward([1, 2], block_mask=torch.zeros(2, 2, dtype=torch.bool))
    assert seq.length == 0


# -- batches -----------------------------------------------------------------------------------------


def test_forward_batch_equals_one_sequence_at_a_time(pair):
    native, model, _ = pair
    prompts = [tokens(n, seed=10 + n) for n in (3, 17, 8)]
    seqs = [native.new_sequence() for _ in prompts]
    first = native.forward_batch(seqs, prompts, num_logits=[1, 2, 8])  # prefill of different lengths
    for out, p in zip(first, prompts, strict=True):
        close(out, reference(model, p)[-out.shape[0] :])
    blocks = [[4], [5, 6, 7, 8, 9], [10, 11]]
    masks = [None, tree_mask([-1, 0, 0, 1, 2]), None]
    second = native.forward_batch(seqs, blocks, block_masks=masks)
    close(second[0], reference(model, prompts[0] + [4])[-1:])
    close(second[2], reference(model, prompts[2] + [10, 11])[-2:])
    close(second[1][3], reference(model, prompts[1] + [5, 6, 8])[-1])  # node 3: path 0 -> 1 -> 3
    assert [s.length for s in seqs] == [4, 22, 10]
    seqs[1].truncate(18)  # each sequence rolls back on its own
    (again,) = native.forward_batch([seqs[1]], [[7]])
    close(again, reference(model, prompts[1] + [5, 7])[-1:])


def test_forward_batch_refuses_a_sequence_twice(llama):
    native, _, _ = llama
    seq = native.new_sequence()
    with pytest.raises(ValueError, match="twice"):
        native.forward_batch([seq, seq], [[1], [2]])


# -- limits (spekula.limits, checked before anything is written to the cache) ------------------------


def test_max_cache_len_caps_the_context_and_bad_forwards_leave_the_sequence_as_it_was(llama):
    native, model, path = llama
    short = NativeBackend.load(path, max_cache_len=64)
    assert short.context_length == 64 and native.context_length == COMMON["max_position_embeddings"]
    ids = tokens(30, seed=6)
    seq = short.new_sequence()
    seq.forward(ids[:20])
    with pytest.raises(ContextExceeded, match="sequence of 65 tokens exceeds the model's context of 64"):
        seq.forward(tokens(45, seed=7))
    with pytest.raises(OutOfVocabulary, match=rf"\[{VOCAB}, -1\] are outside the vocabulary \[0, {VOCAB}\)"):
        seq.forward([1, VOCAB, -1])
    with pytest.raises(ValueError, match="at least one token"):
        seq.forward([])
    assert seq.tokens == ids[:20]
    close(seq.forward(ids[20:]), reference(model, ids)[20:])  # still usable after the refusals


def test_packed_layout_gives_the_same_logits_whatever_the_block_width(llama):
    _, model, path = llama
    packed, rows = NativeBackend.load(path, layout="packed"), NativeBackend.load(path, layout="rows")
    assert packed.layout == "packed" and rows.layout == "rows"
    assert NativeBackend.load(path).layout == "packed"  # the default for fp32 on a CPU
    assert packed.model.layers[0].feed_forward.w13.packed is not None
    assert packed.model.layers[0].feed_forward.w13.weight.numel() == 0  # the plain copy is dropped
    assert rows.model.layers[0].feed_forward.w13.packed is None
    ids = tokens(12, seed=13)
    seq = packed.new_sequence()
    close(seq.forward(ids[:10]), reference(model, ids[:10]))
    block = seq.forward(ids[10:])  # a verify-like block of 2
    close(block, reference(model, ids)[10:])
    seq.truncate(10)
    one_by_one = torch.cat([seq.forward([t]) for t in ids[10:]])
    close(one_by_one, block)
    with pytest.raises(ConfigError, match="layout"):
        NativeBackend.load(path, layout="diagonal")
    bf16 = NativeBackend.load(path, config=BackendConfig(dtype="bfloat16"))
    assert bf16.layout == "rows"
    with pytest.raises(ConfigError, match="fp32 weights on a CPU"):
        NativeBackend.load(path, config=BackendConfig(dtype="bfloat16"), layout="packed")


# -- dtype, loading, registry ------------------------------------------------------------------------


def test_bfloat16_runs_and_stays_near_fp32(llama):
    _, model, path = llama
    bf16 = load_backend("native", path, "tiny", BackendConfig(dtype="bfloat16"))
    assert isinstance(bf16, NativeBackend) and bf16.model.output.weight.dtype == torch.bfloat16
    ids = tokens(12, seed=7)
    out = bf16.new_sequence().forward(ids)
    assert out.dtype == torch.float32
    close(out, reference(model, ids), atol=0.1)


def test_config_parsing_and_refusals(llama):
    native, _, path = llama
    args = native.args
    assert (args.tie_embeddings, args.qkv_bias, args.n_kv_heads, args.head_dim) == (True, False, 2, 16)
    assert "output.weight" not in load_weights(path, torch.float32).weights  # tied: no second copy
    rope = {"rope_theta": 1e6, "rope_type": "default"}
    qwen = args_from_hf_config({**COMMON, "model_type": "qwen2", "rope_parameters": rope})
    assert qwen.qkv_bias and not qwen.o_bias and qwen.rope_theta == 1e6 and qwen.sliding_window == ()
    llama3 = args_from_hf_config(
        {
            **COMMON,
            "model_type": "llama",
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        }
    )
    assert llama3.rope_scaling["rope_type"] == "llama3"
    with pytest.raises(ModelError, match="supports llama"):
        args_from_hf_config({**COMMON, "model_type": "gemma3"})


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    scaling = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    model = LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=scaling)).eval()
    model.save_pretrained(tmp_path)
    ids = tokens(40, seed=8)
    close(NativeBackend.load(tmp_path).new_sequence().forward(ids), reference(model, ids))


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert-time permutation of q/k rows (what native_loader.unpermute undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_gguf_file_loads_the_same_weights(llama, tmp_path):
    """A llama GGUF written the way llama.cpp's converter does (renamed tensors, permuted q/k rows)."""
    import gguf

    native, model, path = llama
    a = native.args
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), arch="llama")
    writer.add_block_count(a.n_layers)
    writer.add_context_length(a.max_seq_len)
    writer.add_embedding_length(a.dim)
    writer.add_feed_forward_length(a.hidden_dim)
    writer.add_head_count(a.n_heads)
    writer.add_head_count_kv(a.n_kv_heads)
    writer.add_rope_freq_base(a.rope_theta)
    writer.add_layer_norm_rms_eps(a.norm_eps)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])  # tied: no output.weight
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(a.n_layers):
        for g, h in names.items():
            w = state[f"model.layers.{i}.{h}.weight"]
            w = _permute(w, a.n_heads) if g == "attn_q" else _permute(w, a.n_kv_heads) if g == "attn_k" else w
            writer.add_tensor(f"blk.{i}.{g}.weight", np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    from_gguf = NativeBackend.load(tmp_path / "tiny.gguf")
    assert from_gguf.eos_token_ids == {2} and from_gguf.args.tie_embeddings
    ids = tokens(14, seed=9)
    close(from_gguf.new_sequence().forward(ids), reference(model, ids))


def test_refuses_a_checkpoint_with_a_missing_tensor(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, '
        '"num_attention_heads": 1, "intermediate_size": 8, "tie_word_embeddings": true}'
    )
    weights = {"model.embed_tokens.weight": torch.zeros(8, 4), "model.norm.weight": torch.ones(4)}
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ModelError, match="no tensor 'model.layers.0.input_layernorm.weight'"):
        NativeBackend.load(tmp_path)


# -- the engine on native backends: greedy speculative == greedy plain -------------------------------


def test_speculative_greedy_equality_native_and_mixed(llama):
    native, _, path = llama
    reference_backend = TransformersBackend.load(path)
    torch.manual_seed(11)
    random_draft = NativeBackend(Transformer(native.args).eval(), name="random")  # same vocabulary, no skill
    prompt = tokens(7, seed=12)
    plain = Engine(native).generate(prompt, SamplingParams(), StopConfig(max_tokens=24, ignore_eos=True)).run()
    assert (
        plain.token_ids
        == Engine(reference_backend)
        .generate(prompt, SamplingParams(), StopConfig(max_tokens=24, ignore_eos=True))
        .run()
        .token_ids
    )
    pairs = {
        "native/native-self": (native, native),
        "native/native-random": (native, random_draft),
        "native/transformers": (native, reference_backend),
        "transformers/native": (reference_backend, native),
    }
    for name, (target, draft) in pairs.items():
        for k in (1, 4):
            spec = (
                Engine(target, DraftModelFactory(draft), SpecConfig(k=k))
                .generate(prompt, SamplingParams(), StopConfig(max_tokens=24, ignore_eos=True))
                .run()
            )
            assert spec.token_ids == plain.token_ids, f"{name} k={k}"
            if name != "native/native-random":
                assert spec.stats.alpha > 0.9, name
