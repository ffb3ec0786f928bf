"""GGUF -> Hugging Face directory (bf16 safetensors + tokenizer), checked by reloading it.

Loading a GGUF into transformers dequantises every tensor (16-60 s here); the converted copy
loads in seconds. The check compares logits of the GGUF-loaded model and of the reloaded copy,
both computed in fp32 from the same bf16 weights, so any tensor lost or mangled on the way
(a tied output layer, a permuted attention weight) shows up as a large difference, while
rounding alone stays far below the tolerance.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path

from spekula.errors import ModelError

PROBE_TEXT = "def fibonacci(n):\n    return"
LOGIT_ATOL = 1e-2  # same weights, same fp32 arithmetic: differences are ~1e-5; a bf16 model would be ~1e-1


def convert_gguf(gguf: Path, out: Path, require_chat_template: bool, report: Callable[[str], None]) -> None:
    """Write a Hugging Face model directory for `gguf` into the (empty) directory `out`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local file needs no hub; never let a typo reach it
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch  # imported here: listing or fetching must not pay for torch when nothing is converted
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    source, name = str(gguf.parent), gguf.name
    report(f"converting {name}: loading the GGUF into transformers (dequantising; up to a minute)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
        # dequantize=True: a dense model whatever optional kernels happen to be installed.
        model = AutoModelForCausalLM.from_pretrained(
            source,
            gguf_file=name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
            local_files_only=True,
        )
    except (ValueError, KeyError, NotImplementedError, OSError, RuntimeError) as error:
        raise ModelError(
            f"transformers could not load {gguf} ({type(error).__name__}: {error}). The file itself is intact; "
            "this transformers version may not support its architecture: use a llama.cpp backend with the GGUF, "
            "or a transformers version that loads it."
        ) from error
    if require_chat_template and tokenizer.chat_template is None:
        raise ModelError(f"{name} should carry a chat template but its tokenizer has none; the file is not the expected one.")

    # transformers refuses to save a model it believes is quantized; the weights are dense bf16 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    probe = torch.tensor([tokenizer.encode(PROBE_TEXT)])  # [1, S]
    with torch.inference_mode():
        expected = model.float()(probe).logits  # [1, S, V]
    del model
    gc.collect()

    report(f"converting {name}: reloading the converted copy to check it")
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True)
    with torch.inference_mode():
        actual = reloaded(probe).logits
    del reloaded
    gc.collect()
    diff = (actual - expected).abs().max().item()
    if diff > LOGIT_ATOL or not torch.equal(actual.argmax(-1), expected.argmax(-1)):
        raise ModelError(f"The converted copy of {name} computes different logits (max |diff| {diff:.3g}); not keeping it.")

    saved = AutoTokenizer.from_pretrained(str(out))
    if saved.encode(PROBE_TEXT) != probe[0].tolist() or saved.chat_template != tokenizer.chat_template:
        raise ModelError(f"The converted tokenizer of {name} differs from the GGUF's; not keeping it.")
    report(f"converting {name}: done (max |logit diff| {diff:.2g})")
