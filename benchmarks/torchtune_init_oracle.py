"""What torchtune 0.1's QLoRA model build reserves on the GPU, traced with torchao 0.1's own quantization
code and replayed through the simulate engine's caching-allocator emulation.

Why: the torchtune QLoRA tutorial row (M0170) states 9.13 GB reserved right after model init and 9.29 GB
in training; tuneplan estimates the training step. This script asks how much of that reservation the
build itself explains. Not part of CI; needs the venv of benchmarks/torchtune_oracle.py:

    /tmp/tt01venv/bin/python benchmarks/torchtune_init_oracle.py

Two builds are traced on fake tensors (no GPU): torchtune 0.1.1's own ``qlora_llama2_7b`` (one decoder
layer built on the device and quantized, the others deep-copied by ``_get_clones``), and the same model
with every layer's seven projections quantized on the device. torchao's ``NF4Tensor`` cannot wrap fake
tensors, so the stand-in runs torchao 0.1's ``double_quantize_scalers`` and ``convert_to_norm_float_weight``
(its n x 16 distance matrix included) and then allocates the NF4 storage (packed codes and scalers).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tuneplan.simulate.allocator import replay
from tuneplan.simulate.tracker import StorageTracker, find_peak

# torchao 0.1 nf4tensor.py: the NF4 code book it builds on the weight's device
NF4 = [-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0, 0.0796, 0.1609, 0.2461, 0.3379,
       0.4407, 0.5626, 0.7230, 1.0]
BLOCK, SCALER_BLOCK = 64, 256  # torchtune 0.1 to_nf4 defaults


def to_nf4_traced(w: torch.Tensor) -> torch.Tensor:
    from torchao.dtypes.nf4tensor import NF4Tensor

    n = w.numel()
    nf4 = torch.tensor(NF4, device=w.device, dtype=torch.bfloat16)
    scalers = NF4Tensor.double_quantize_scalers(w.flatten(), BLOCK, SCALER_BLOCK)
    codes = NF4Tensor.convert_to_norm_float_weight(w, n // BLOCK, BLOCK, nf4)
    # n/2 B codes + n/64 B scalers
    out = torch.empty(n // 4 + n // 128, dtype=torch.bfloat16, device=w.device)
    del scalers, codes
    return out


def traced(build) -> tuple[float, float, float]:
    tracker = StorageTracker(None)
    with FakeTensorMode(allow_non_fake_inputs=True), tracker:
        kept = build()
    res = tracker.result()
    end = sum(b.size for b in res.blocks if b.freed_at < 0)  # what the built model holds
    del kept
    return end / 1e9, find_peak(res).bytes / 1e9, replay(res.events).stats.max_reserved / 1e9


def torchtune_build() -> object:
    import torchtune.modules.peft.lora as tl
    from torchtune.models.llama2 import qlora_llama2_7b

    tl.to_nf4 = to_nf4_traced
    torch.set_default_dtype(torch.bfloat16)  # recipe: utils.set_default_dtype(self._dtype), self._device
    try:
        return qlora_llama2_7b(lora_attn_modules=["q_proj", "k_proj", "v_proj", "output_proj"],
                               apply_lora_to_mlp=True, apply_lora_to_output=False, lora_rank=8, lora_alpha=16)
    finally:
        torch.set_default_dtype(torch.float32)


def every_layer_build() -> list[torch.Tensor]:
    h, inter, vocab, r = 4096, 11008, 32000, 8
    keep = [torch.empty(vocab * h, dtype=torch.bfloat16)]
    for _ in range(32):
        for shape in [(h, h)] * 4 + [(inter, h)] * 2 + [(h, inter)]:
            w = torch.empty(shape, dtype=torch.bfloat16)  # nn.Linear's own bf16 init on the device
            keep.append(to_nf4_traced(w))
            del w
            keep += [torch.empty(r * shape[1], dtype=torch.bfloat16),
                     torch.empty(r * shape[0], dtype=torch.bfloat16)]
        keep.append(torch.empty(2 * h, dtype=torch.bfloat16))
    keep.append(torch.empty(vocab * h, dtype=torch.bfloat16))
    return keep


def main() -> None:
    print("Llama-2-7B QLoRA build (GB = 1e9 B)    allocated at end   allocated peak   emulated reserved peak")
    for label, build in (("torchtune 0.1.1 (one layer, clones)", torchtune_build),
                         ("every layer quantized on the device", every_layer_build)):
        end, peak, reserved = traced(build)
        print(f"{label:38s} {end:10.2f} {peak:16.2f} {reserved:16.2f}")
    print("M0170 states 9.13 GB reserved after model init (9.29 GB in training)")


if __name__ == "__main__":
    main()
