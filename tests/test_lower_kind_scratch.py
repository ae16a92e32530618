"""The top layer's backward scratch without the lower kinds': a LoRA run's first adapted layer reads an input
that needs no gradient (a kind of its own: activations.layer_kinds), and, back-propagated last, its own
scratch comes only once every layer above has released its saved tensors (autograd runs the layers' nodes
top down and frees each one's saved tensors after it runs). Beside every saved activation (the top layer's
row) only the upper kinds' scratch is live (ActivationPlan.upper_backward_temp_bytes)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.activations import saved_at  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

T = S = 2048


def test_top_layer_scratch_leaves_out_the_first_layers() -> None:
    # phi-2 (h 2560, 32 heads of 80, GELU MLP 10240, parallel block), 4 layers, QLoRA r16 on q, v, bf16
    # under the HF Trainer's autocast (fp32 residual after PEFT's kbit upcast), eager, 1 x 2048, DDP on 4.
    # Eager scores' backward per head and key position: the fp32 probabilities' and the scores' gradients
    # (4 + 4) less the bf16 probabilities cast probs @ V released (2): 32 x 6 = 192 B. Per token beside
    # them: the residual's two fp32 gradients 2 x 4 x 2560, less what the layer released before: the
    # output dropout's mask 2560 and V's bf16 copy 2 x 2560, and (above layer 0) the MLP's four fp32 GELU
    # tensors 4 x 4 x 10240. Layer 0's MLP has no adapter and reads an input without gradient: outside the
    # graph, it releases nothing.
    spec = reduced_model("microsoft/phi-2", 4)
    setup = build_setup(spec, method="qlora", precision="bf16", framework="hf", batch=1, seq=S, bits=4,
                        quant_type="fp4", rank=16, attn="eager", gradient_checkpointing=False, num_labels=1,
                        gpus=4)
    acts = saved_at(memory_statics(resolve_run(spec, setup)).acts, 1, S)
    scores = T * S * 32 * (4 + 4 - 2)
    residual = 2 * 4 * 2560 - 2560 - 2 * 2560
    assert acts.backward_temp_bytes == scores + T * residual
    assert acts.upper_backward_temp_bytes == scores + T * (residual - 4 * 4 * 10240)
