"""The outputs a training loop holds stay live through the token embedding's backward, the last of the
backward (fsdp_qlora train.py binds ``output`` until after ``optimizer.step()``): the embedding's row counts
them as the layers' rows do (estimator/instants.layer_backward_rows)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at, named  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402


def test_fsdp_qlora_loop_holds_its_logits_at_the_embedding() -> None:
    # Llama-3.2-1B (vocabulary 128,256), full bf16-mixed, 1 x 1024: the fp32 logits the loop holds,
    # 1024 x 128,256 x 4 = 525,336,576 B (simulate: fsdp_qlora, Llama-3.2-1B[4L]: 525,337,088 B of
    # logits_loss, one 512-B block more, at the embedding backward's add, the peak)
    spec = reduced_model("meta-llama/Llama-3.2-1B", 4)
    setup = build_setup(spec, method="full", precision="bf16-mixed", framework="fsdp-qlora", batch=1,
                        seq=1024, optimizer="adamw-fused", attn="eager")
    rows = memory_at(resolve_run(spec, setup), 1, 1024).rows
    assert named(rows["backward_embedding"]).logits_loss == 1024 * 128_256 * 4 == 525_336_576
