"""Are llama.cpp's logits for a sequence the same, bit for bit, whether its row is alone in a pass or
batched with other sequences' rows? The server's shared context (17 sequences, flash attention), with
repacked weights on or off (exact mode's weights). 16 sequences each hold a different 60-token prompt;
each scores one token alone, then B of them score it together; then a 4-token block beside 7 rows.

    .venv/bin/python scripts/experiments/batch_invariance.py off|on [MODEL] [q8k]   # about a minute for the 1.5B

2026-12-01 (AVX-512 machine), K cache F16 (the server's default), repacking on and off alike:
- Qwen2.5-Coder-1.5B Q4_K_M: 0 of B rows equal for every B from 2 to 16, max |diff| 0.33 to 0.46 of a
  logit; the 4-token block differs too.
- SmolLM2-135M (Q4_1): 0 of B equal for B from 2 to 8 (3 of 12, 7 of 16), max |diff| 0.78; the 4-token
  block beside 7 rows is bitwise its lone pass (as tests/server/test_llamacpp_batching.py finds for
  blocks), so it is a lone ONE-row pass that takes another path than a row among others.
Why (found later that day, scripts/experiments/exact_kernels.py): the shared context's passes read 512
KV cells or more, and for a single query row llama.cpp's flash attention then splits the cells between
threads (ggml's split-KV path, only for an F16 or F32 K cache). With `q8k` (a Q8_0 K cache, exact mode's):
- Qwen2.5-Coder-1.5B, repacking on: 2/2 and 3/3 rows equal to alone, then 0/4, 1/5, 0/8, 0/12, 0/16 (max
  |diff| 0.38 to 0.43): four rows and more go through the repacked weights' 4-row kernels together; the
  4-token block beside 7 rows differs.
- SmolLM2-135M (its Q4_1 weights are not repacked): B/B equal for every B from 2 to 16, and the 4-token
  block beside 7 rows equals its lone pass.
So exact batched serving is within reach: a Q8_0 K cache, passes of at most the width a load check finds
invariant in the shared context (3 rows for Qwen's Q4_K_M, 16 or more for SmolLM2), prefill chunks that
do not depend on the batch, and each sequence's cells in position order after rollbacks (not checked
here: each sequence gave back only its own last cell, and took it again). Not built.
"""

import sys

import llama_cpp
import llama_cpp._internals as internals
import torch

from spekula.config import BackendConfig
from spekula.pipeline import load_model

repack = sys.argv[1] == "on"
q8_k = len(sys.argv) > 3 and sys.argv[3] == "q8k"  # K cache in Q8_0, as exact mode keeps it
Model, Context = internals.LlamaModel, internals.LlamaContext


class Patched(Model):
    def __init__(self, *a, params=None, **kw):
        params.use_extra_bufts = repack
        super().__init__(*a, params=params, **kw)


class PatchedContext(Context):
    def __init__(self, *, model, params, verbose):
        if q8_k:
            params.type_k = llama_cpp.GGML_TYPE_Q8_0
        super().__init__(model=model, params=params, verbose=verbose)


internals.LlamaModel, internals.LlamaContext = Patched, PatchedContext
backend, codec = load_model(
    sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-1.5b",
    BackendConfig(runtime="llamacpp", threads=2, parallel=17, context_length=512),
)
texts = [f"Request {i}: please write about topic number {i * 7} and explain it in detail. " * 4 for i in range(16)]
seqs = []
for t in texts:
    s = backend.new_sequence()
    s.forward(codec.encode(t)[:60], 1)
    seqs.append(s)
nxt = [codec.encode(" and")[0]] * 16
solo = []
for s, t in zip(seqs, nxt, strict=True):
    solo.append(s.forward([t]))
    s.truncate(s.length - 1)
for B in (2, 3, 4, 5, 8, 12, 16):
    out = backend.forward_batch(seqs[:B], [[t] for t in nxt[:B]], [1] * B)
    same = sum(torch.equal(o, e) for o, e in zip(out, solo[:B], strict=True))
    diff = max(float((o - e).abs().max()) for o, e in zip(out, solo[:B], strict=True))
    equal = f"{same}/{B} bitwise equal to alone"
    print(f"repack {sys.argv[1]}: batch of {B} one-row sequences: {equal}, max |diff| {diff:.2e}")
    for s in seqs[:B]:
        s.truncate(s.length - 1)
# a 4-row block beside 7 one-row sequences vs alone
block = codec.encode(" and then we go")[:4]
alone = seqs[0].forward(block)
seqs[0].truncate(seqs[0].length - 4)
out = backend.forward_batch(seqs[:8], [block] + [[t] for t in nxt[1:8]], [4] + [1] * 7)
print(f"repack {sys.argv[1]}: a 4-token block beside 7 one-row sequences equal to alone: {torch.equal(out[0], alone)}")
