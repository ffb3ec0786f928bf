"""Which llama.cpp graph node first computes a token's row differently in a block than in a one-token pass:
the tool that found the two kernels exact mode's build patches (docs/decisions/0009-exact-kernels.md).

A prompt is decoded, then the next W tokens once as a block and (in a fresh context) the first of them alone;
llama.cpp's eval callback copies the first token's row of every F32 node of both passes, and the first node whose
rows differ bit for bit is printed with its op and shapes. Settings as exact mode's (repacking on, flash
attention on, K cache Q8_0); the library is the installed llama_cpp (PYTHONPATH may point at another build).

    .venv/bin/python scripts/experiments/first_divergent_node.py [--width 8] [--prompt-tokens 100] [--no-flash] [GGUF]

2026-12-04, this Intel Xeon (AVX-512), Qwen2.5-Coder-1.5B Q4_K_M, 1 thread: on the unpatched build, width 4:
first difference at `Qcur-0` (MUL_MAT, the repacked Q4_K gemm); with the gemm patched, width 8: `Vcur-0` (MUL_MAT,
Q6_K weights, ggml's tiled kernel from 8 rows); with both patched: no difference up to 17.
With `--no-flash` (2026-12-04, 300 prompt tokens, 2 threads): before patch 0004, width 2 first differs at `kq-0`
(a one-row F16 matmul by vec_dot, a wider one by tinyBLAS), logits 0.52 apart; with it, none at widths 2 and 16.
"""

from __future__ import annotations

import argparse
import ctypes

import llama_cpp as L
import numpy as np

from spekula.models.store import resolve


class Tensor(ctypes.Structure):  # ggml.h's struct ggml_tensor, llama.cpp as vendored by llama-cpp-python 0.3.36
    _fields_ = [
        ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]  # fmt: skip


RECORD: list[tuple[str, int, tuple[int, ...], np.ndarray]] = []


@ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
def observe(address, ask, _user):
    if ask:
        return True
    t = Tensor.from_address(address)
    if t.type == L.GGML_TYPE_F32 and t.nb[0] == 4:  # the first token's row: the first ne[0] floats
        row = np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)), shape=(t.ne[0],)).copy()
        RECORD.append((t.name.decode(), t.op, tuple(t.ne), row))
    return True


def context(model, threads: int, flash: bool):
    params = L.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 1024, 512, threads, threads
    if flash:
        params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_k = L.GGML_TYPE_Q8_0
    else:  # attention as matmuls, K and V in F16 (docs/decisions/0013-exact-attention-without-flash.md)
        params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.cb_eval = observe
    return L.llama_init_from_model(model, params)


def decode(ctx, tokens: list[int], start: int) -> None:
    batch = L.llama_batch_init(len(tokens), 0, 1)
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, start + i, 1, 1
        batch.seq_id[i][0] = 0
    assert L.llama_decode(ctx, batch) == 0
    L.llama_batch_free(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", nargs="?", default="qwen2.5-coder-1.5b", help="a built-in model's name or a GGUF path")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-flash", action="store_true", help="attention as matmuls (K in F16) instead")
    args = parser.parse_args()
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.use_extra_bufts = True
    model = L.llama_model_load_from_file(str(resolve(args.gguf).gguf_path).encode(), params)
    text = open(__file__, "rb").read()
    ids = (L.llama_token * 8192)()
    n = L.llama_tokenize(L.llama_model_get_vocab(model), text, len(text), ids, 8192, True, False)
    prompt, block = list(ids[: args.prompt_tokens]), list(ids[args.prompt_tokens : args.prompt_tokens + args.width])
    assert n >= len(prompt) + len(block)
    rows = {}
    for name, width in (("alone", 1), ("block", args.width)):
        ctx = context(model, args.threads, flash=not args.no_flash)
        decode(ctx, prompt, 0)
        RECORD.clear()
        decode(ctx, block[:width], len(prompt))
        rows[name] = list(RECORD)
        L.llama_free(ctx)
    pairs = [(a, b) for a, b in zip(rows["alone"], rows["block"], strict=False) if a[3].shape == b[3].shape]
    # K*Q's row holds every cell the pass reads; cells past the first token's position are masked, never summed
    visible = args.prompt_tokens + 1
    differ = [
        (a, b)
        for a, b in pairs
        if not np.array_equal(*(r[3][:visible] if r[0].startswith("kq-") else r[3] for r in (a, b)))
    ]
    if not differ:
        print(f"width {args.width}: the first token's row is the same bits at every node ({len(pairs)} nodes)")
        return
    (name, op, ne, alone), (_, _, ne_block, in_block) = differ[0]
    (last, _, _, logits_alone), (_, _, _, logits_block) = pairs[-1]
    print(f"width {args.width}: first difference at {name} (op {op}, {ne} alone, {ne_block} in the block), "
          f"max |delta| {float(np.abs(alone - in_block).max()):.3g}; at {last} (the logits) "
          f"{float(np.abs(logits_alone - logits_block).max()):.3g}")  # fmt: skip


if __name__ == "__main__":
    main()
