"""GGUF -> Hugging Face directory (bf16 safetensors + tokenizer), checked by reloading it.

Loading a GGUF into transformers dequantises every tensor, which is slow; the converted copy
loads in seconds. Before the copy is kept, the logits of a short probe must agree with those
of the GGUF-loaded model in the same dtype, reloaded in bf16 and in fp32 (the GGUF-loaded model
upcast). Same weights and same arithmetic: a tensor lost or mangled on the way (a tied output
layer, a permuted attention weight) cannot pass. Comparing bf16 with fp32 arithmetic would not
do: on Qwen 1.5B they differ by far more than RTOL.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path

from spekula.errors import ModelError

PROBE_TEXT = "def fibonacci(n):\n    return"
# Of the largest |logit|. The reloaded copies match exactly, except Gemma in fp32 by a little: its
# embedding scale is a buffer rounded to bf16 in the upcast model and exact in the one loaded in fp32.
RTOL = 0.01


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
        raise ModelError(
            f"{name} should carry a chat template but its tokenizer has none; the file is not the expected one."
        )

    # transformers refuses to save a model it believes is quantized; the weights are dense bf16 now.
    model.hf_quantizer = None  # type: ignore[assignment]  # an attribute of the model, not a submodule
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    probe = torch.tensor([tokenizer.encode(PROBE_TEXT)])  # [1, S]
    expected = {torch.bfloat16: _logits(model, probe), torch.float32: _logits(model.float(), probe)}
    del model
    gc.collect()

    report(f"converting {name}: reloading the converted copy (bf16, then fp32) to check it")
    for dtype, reference in expected.items():
        reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype, local_files_only=True)
        actual = _logits(reloaded, probe)
        del reloaded
        gc.collect()
        diff = (actual - reference).abs().max().item()
        scale = reference.abs().max().item()
        if not diff <= RTOL * scale:
            raise ModelError(
                f"The converted copy of {name} reloaded in {dtype} computes different logits "
                f"(max |diff| {diff:.3g}, largest |logit| {scale:.3g}); not keeping it."
            )
        report(f"converting {name}: {dtype} reload matches (max |logit diff| {diff:.2g} of {scale:.3g})")

    saved = AutoTokenizer.from_pretrained(str(out))
    if saved.encode(PROBE_TEXT) != probe[0].tolist() or saved.chat_template != tokenizer.chat_template:
        raise ModelError(f"The converted tokenizer of {name} differs from the GGUF's; not keeping it.")


def _logits(model, probe):
    """fp32 logits [1, S, V] of the model as it is (bf16 arithmetic for a bf16 model)."""
    import torch

    with torch.inference_mode():
        return model(probe).logits.float()
