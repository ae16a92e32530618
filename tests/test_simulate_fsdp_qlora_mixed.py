"""Answer.AI's fsdp_qlora ``train.py`` under ``--precision bf16_autocast`` (tuneplan's ``bf16-mixed``): a LoRA
model loads with ``torch_dtype=float32`` and the forward runs under ``torch.cuda.amp.autocast`` (train.py
``fsdp_main``), so the frozen base stays fp32 and autocast casts each weight for its matmul. Autocast caches
a cast only for a leaf that requires grad (autocast_mode.cpp ``cached_cast``): a frozen weight's cast is
kept only where autograd saves it, which a checkpointed layer does not; the lm_head's is (its input needs a
gradient)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import agreement  # noqa: E402


def test_fp32_base_and_only_the_heads_cast_kept_under_checkpointing() -> None:
    # Llama-3.2-1B at 2 layers: tied embeddings, vocabulary 128256, hidden 2048
    setup = dict(framework="fsdp-qlora", method="lora", precision="bf16-mixed", gradient_checkpointing=True,
                 batch=1, seq=256, targets="q_proj,v_proj")
    r = agreement.run_case(agreement.Case("fsdp-qlora lora bf16-mixed gc", "meta-llama/Llama-3.2-1B", setup,
                                          layers=2))
    from random_setups import reduced_model

    spec = reduced_model("meta-llama/Llama-3.2-1B", 2)
    # every parameter in fp32 (the tied embedding counted once), beside the rotary embedding's two fp32
    # buffers of head_dim / 2 values, each rounded up to the allocator's 512 B
    assert r["components"]["weights"]["sim"] == 4 * spec.params_total + 2 * 512
    # the tied head's bf16 cast, 128256 x 2048 x 2 B, is the one autocast copy alive at the peak
    assert r["components"]["autocast_copies"]["sim"] == 128256 * 2048 * 2
    assert abs(r["rel"]) <= 0.03, r["rel"]
