"""A QLoRA adapter's dtype when PEFT does not upcast it: PEFT builds each adapter in the dtype of its base
layer (``BaseTunerLayer._move_adapter_to_device_of_base_layer`` reads
``_get_base_layer_device_and_dtype``, which for a bitsandbytes ``Linear4bit`` is its ``compute_dtype``),
so under fsdp_qlora's profile (no ``autocast_adapter_dtype``) the adapters stay 16-bit even when an
unquantized base would load in fp32 under ``-mixed`` (estimator/dtypes.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory import memory_breakdown  # noqa: E402


def test_fsdp_qlora_one_gpu_adapters_stay_in_the_compute_dtype() -> None:
    # Llama-2-7b (h 4096, MLP 11008), 4 layers, QLoRA rank 64 on fsdp_qlora's default targets q, k, v,
    # gate, up, down under fp16_autocast: per layer 3 x 64 x (4096 + 4096) + 3 x 64 x (4096 + 11008)
    # = 4,472,832 adapter parameters, 17,891,328 in all, fp16 (the Linear4bit's compute dtype): 2 B each,
    # their gradients 2 B (held across the accumulation), torch AdamW's two states in the parameter's
    # dtype 4 B, and no autocast copy (autocast leaves an fp16 weight as it is)
    spec = reduced_model("meta-llama/Llama-2-7b-hf", 4)
    setup = build_setup(spec, method="qlora", precision="fp16-mixed", framework="fsdp-qlora", batch=1,
                        seq=64, grad_accum=2, gradient_checkpointing=False, bits=4, quant_type="fp4", rank=64,
                        optimizer="adamw")
    parts = memory_breakdown(spec, setup).components
    params = 4 * (3 * 64 * (4096 + 4096) + 3 * 64 * (4096 + 11008))
    assert parts["lora_adapters"] == 2 * params == 35_782_656
    assert parts["gradients"] == 2 * params
    assert parts["optimizer_states"] == 4 * params
    assert parts["autocast_copies"] == 0


def test_hf_qlora_adapters_are_upcast_by_peft() -> None:
    # the HF profile passes autocast_adapter_dtype=True: PEFT upcasts the same adapters to fp32
    spec = reduced_model("meta-llama/Llama-2-7b-hf", 4)
    setup = build_setup(spec, method="qlora", precision="fp16-mixed", framework="hf", batch=1, seq=64,
                        gradient_checkpointing=False, bits=4, rank=64,
                        targets="q_proj,k_proj,v_proj,gate_proj,up_proj,down_proj", optimizer="adamw")
    params = 4 * (3 * 64 * (4096 + 4096) + 3 * 64 * (4096 + 11008))
    assert memory_breakdown(spec, setup).components["lora_adapters"] == 4 * params
