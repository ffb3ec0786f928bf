"""Whether a request's greedy text depends on the request before it, through the prompt cache, in exact mode.

A fresh pipeline (llama.cpp, the project's build, exact mode's defaults, `--draft none`) answers prompt A, then
prompt B, with the prompt cache off (`--no-prompt-cache`: B's text is a fresh prefill's); then another does the same
with it on (the default: only rows a fresh prefill of B would compute alike are reused), and a third with
`--prompt-cache-any-rows` (every row B shares with A, as llama.cpp's `cache_prompt` reuses them). B's prompt shares
the chat template's system turn with A's, which A's prompt pass computed. Where B's prompt is narrower than a wide
prefill pass (Capabilities.prefill_min_rows) and A's is not, those rows were computed by the wide pass's kernels, where
a fresh B computes every row by the one-row kernels: other bits, and on a near-tie another text. Plain and speculative
decoding see the same cache, so they agree with each other either way (the lossless tests).
docs/decisions/0018-history-exact-prompt-cache.md is the record.

    .venv/bin/python scripts/experiments/prompt_cache_history.py [A_ID B_ID [MODEL]]

Default A = code-editing-08, B = creative-writing-11 of the built-in suite (96 tokens each). On this 2-core AMD
EPYC (2026-12-05, Qwen2.5-Coder-1.5B Q4_K_M): B fresh gave a 96-token story, and the same story after A with the
default cache (nothing reused); reusing A's 24 rows (what every server did before decision 0018, and what
llama-server does), "I'm sorry, but I can't assist with that." (12 tokens).
"""

import sys

from spekula.bench.workloads import BUILTIN, load_workload
from spekula.cli import build_parser
from spekula.config import SamplingParams, StopConfig
from spekula.options import backend_from_args, draft_backend_from_args, spec_from_args
from spekula.pipeline import Pipeline

A_ID = sys.argv[1] if len(sys.argv) > 2 else "code-editing-08"
B_ID = sys.argv[2] if len(sys.argv) > 2 else "creative-writing-11"
MODEL = sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-coder-1.5b"


def main() -> None:
    items = {item.id: item for item in load_workload(BUILTIN)}
    texts = {}
    for extra in (["--no-prompt-cache"], [], ["--prompt-cache-any-rows"]):  # a fresh pipeline each: A, then B
        args = build_parser().parse_args(["generate", "--target", MODEL, "--draft", "none", *extra])
        pipe = Pipeline.load(
            args.target, args.draft, spec_from_args(args), backend_from_args(args), draft_backend_from_args(args)
        )
        for item_id in (A_ID, B_ID):
            ids = items[item_id].encode(pipe.codec, chat=True)
            result = pipe.generate(ids, SamplingParams(), StopConfig(max_tokens=96))
            texts[" ".join(extra), item_id] = text = pipe.codec.decode(result.token_ids)
            print(
                f"{' '.join(extra) or 'prompt cache on'}: {item_id}, {len(ids)} prompt tokens, "
                f"{result.stats.cached_tokens} reused: {len(result.token_ids)} tokens {text[:50]!r}",
                flush=True,
            )
    for extra in ("", "--prompt-cache-any-rows"):
        same = texts[extra, B_ID] == texts["--no-prompt-cache", B_ID]
        cache = extra or "prompt cache on"
        print(f"{B_ID} after {A_ID}, {cache}: {'the same text as' if same else 'NOT the text of'} a fresh prefill")


if __name__ == "__main__":
    main()
