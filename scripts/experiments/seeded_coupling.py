"""What the seeded positional rule (spekula.noise, spekula.verify.verify_positional) costs: acceptance of a draft
model's tokens against standard rejection sampling, and the time of one draw against torch.multinomial.

A draft model's token at output position j is draw(q_j, u_j), the inverse CDF of q at the position's uniform, and
it is accepted iff it equals the target's draw(p_j, u_j): with probability sum_x |I_p(x) & I_q(x)|, the overlap of
the intervals each token owns in the two CDFs (token-id order). Standard rejection sampling accepts with
sum_x min(p(x), q(x)); Gumbel-max coupling (the same noise vector through argmax(log p + g) and argmax(log q + g))
with sum_x 1 / sum_y max(p_y / p_x, q_y / q_x), computed here on the tokens that hold p or q >= 1e-4 with the
rest of the vocabulary counted against it (a lower bound). All three are exact per position, no sampling.

    .venv/bin/python scripts/experiments/seeded_coupling.py timing           # draw vs multinomial, V = 151936
    .venv/bin/python scripts/experiments/seeded_coupling.py synthetic        # draft = target's logits + noise
    .venv/bin/python scripts/experiments/seeded_coupling.py models [TARGET DRAFT]   # real models, llama.cpp

`models` samples each prompt's continuation from the target (plain seeded decoding), scores it with both models in
one teacher-forced pass each, and compares the three acceptances position by position, at temperature 1 and at
temperature 0.7 with top-p 0.9 (the llama.cpp runtime, two threads).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from spekula.config import BackendConfig, SamplingParams, StopConfig
from spekula.engine import Engine
from spekula.noise import draw
from spekula.sampling import probabilities

VOCAB = 151936  # Qwen2.5's
SUPPORT = 1e-4  # Gumbel coupling is computed over the tokens with p or q at least this
SETTINGS = {"t=1": SamplingParams(temperature=1.0), "t=0.7,top_p=0.9": SamplingParams(temperature=0.7, top_p=0.9)}
PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string and returns a datetime, with error handling.",
    "Explain the difference between a process and a thread to a new programmer.",
    "Return a JSON object describing a fictional book: title, author, year, genres, and a short summary.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Use a list comprehension: result = []\nfor x in items:\n    if x > 0:\n        result.append(x * 2)",
    "Summarise the main causes of the French Revolution in five bullet points.",
]


def acceptances(p: torch.Tensor, q: torch.Tensor) -> tuple[float, float, float]:
    """(rejection sampling, inverse-CDF coupling, Gumbel coupling lower bound) for one position's p and q [V]."""
    p, q = p.double(), q.double()
    p, q = p / p.sum(), q / q.sum()
    rejection = float(torch.minimum(p, q).sum())
    P, Q = torch.cumsum(p, 0), torch.cumsum(q, 0)
    overlap = torch.clamp(torch.minimum(P, Q) - torch.maximum(P - p, Q - q), min=0.0)
    return rejection, float(overlap.sum()), _gumbel(p, q)


def _gumbel(p: torch.Tensor, q: torch.Tensor) -> float:
    keep = (p >= SUPPORT) | (q >= SUPPORT)
    ps, qs = p[keep], q[keep]  # [n]
    p_rest, q_rest = float(p[~keep].sum()), float(q[~keep].sum())
    both = (ps > 0) & (qs > 0)  # only these can win both races
    px, qx = ps[both][:, None], qs[both][:, None]  # [m, 1]
    # P(x wins both races) = 1 / sum_y max(p_y / p_x, q_y / q_x), y over the whole vocabulary; the tokens left out
    # add at most p_rest / p_x + q_rest / q_x to the sum
    denominators = torch.maximum(ps[None, :] / px, qs[None, :] / qx).sum(dim=1) + p_rest / px[:, 0] + q_rest / qx[:, 0]
    return float((1.0 / denominators).sum())


def timing() -> None:
    torch.set_num_threads(1)
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 3.0
    p = probabilities(logits, SamplingParams(temperature=1.0))
    g = torch.Generator().manual_seed(0)
    cases = {
        "probabilities (softmax)": lambda: probabilities(logits, SamplingParams(temperature=1.0)),
        "torch.multinomial": lambda: int(torch.multinomial(p, 1, generator=g)),
        "noise.draw (inverse CDF)": lambda: draw(p, 0.6180339887),
    }
    for name, f in cases.items():
        f()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(200):
                f()
            times.append((time.perf_counter() - t0) / 200)
        print(f"{name:28s} median of 5 x 200: {sorted(times)[2] * 1e6:8.1f} us per token (V = {VOCAB})")


def report(rows: list[tuple[float, float, float]], label: str) -> None:
    a = np.asarray(rows)
    rs, icdf, gumbel = a.mean(axis=0)
    print(
        f"{label:34s} positions {len(a):5d}  rejection sampling {rs:.3f}  inverse-CDF coupling {icdf:.3f} "
        f"({icdf / rs:.1%} of it)  Gumbel coupling >= {gumbel:.3f} ({gumbel / rs:.1%})"
    )


def synthetic() -> None:
    """Target logits: a sharp head over random token ids; draft: the same plus Gaussian noise of sigma."""
    g = torch.Generator().manual_seed(0)
    for name, params in SETTINGS.items():
        for sigma in (0.5, 1.0, 2.0):
            rows = []
            for _ in range(40):
                target = torch.randn(VOCAB, generator=g) * 2.0
                head = torch.randint(0, VOCAB, (20,), generator=g)
                target[head] += torch.linspace(12.0, 4.0, 20)
                draft = target + torch.randn(VOCAB, generator=g) * sigma
                rows.append(acceptances(probabilities(target, params), probabilities(draft, params)))
            report(rows, f"{name}, draft noise sigma {sigma}")


def models(target_name: str, draft_name: str, tokens: int = 96) -> None:
    from spekula.pipeline import load_model

    config = BackendConfig(runtime="llamacpp", threads=2, context_length=1024)
    target, codec = load_model(target_name, config)
    draft, _ = load_model(draft_name, config)
    engine = Engine(target)
    for name, params in SETTINGS.items():
        rows = []
        for i, prompt in enumerate(PROMPTS):
            ids = codec.encode(prompt, chat=True)
            sampling = SamplingParams(params.temperature, top_p=params.top_p, seed=i)
            out = engine.generate(ids, sampling, StopConfig(max_tokens=tokens)).run().token_ids
            if len(out) < 2:
                continue
            context = ids + out[:-1]
            p = probabilities(target.new_sequence().forward(context, num_logits=len(out)), params)
            q = probabilities(draft.new_sequence().forward(context, num_logits=len(out)), params)
            rows += [acceptances(p[j], q[j]) for j in range(len(out))]
        report(rows, f"{target_name} / {draft_name}, {name}")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "synthetic"
    if what == "timing":
        timing()
    elif what == "synthetic":
        synthetic()
    elif what == "models":
        models(*(sys.argv[2:4] if len(sys.argv) > 3 else ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")))
    else:
        sys.exit(f"unknown mode {what!r}: timing, synthetic or models")
