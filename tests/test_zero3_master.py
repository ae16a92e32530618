"""ZeRO-3's fp32 master partition in an fp32 run, counted by hand from DeepSpeed 0.19.8's stage3.py."""

from __future__ import annotations

import torch

from tuneplan.api import build_setup
from tuneplan.estimator.optimizer import OptimizerPlan
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero_terms import deepspeed_terms, partition_optimizer_plan
from tuneplan.specs.model import model_from_config


def test_the_in_place_branch_never_matches_a_device_name() -> None:
    # stage3.py ``_create_fp32_partitions`` keeps the fp32 partition as the master only when
    # ``fp16_partitioned_groups_flat[i].device == self.device``; ``self.device`` is the accelerator's
    # ``current_device_name()``, a str ('cuda:0', 'cpu'), and a torch.device never equals a str
    assert torch.device("cpu") != "cpu"
    assert torch.device("cuda", 0) != "cuda:0"


def test_an_fp32_full_fine_tune_clones_its_partition_into_the_master() -> None:
    # GPT-2-sized (h 768, 2 layers, vocab 50257, tied): every parameter trains in fp32 over 2 GPUs; the
    # else branch ``.to(self.device, dtype=fp32)`` (no copy: same dtype) ``.clone()``: 4 B per element of
    # this rank's partition, beside the optimizer's own states
    cfg = dict(model_type="gpt2", n_embd=768, n_layer=2, n_head=12, vocab_size=50257, n_positions=1024)
    spec = model_from_config(cfg, "gpt2-2L")
    setup = build_setup(spec, method="full", precision="fp32", gpus=2, zero=3, optimizer="adamw-8bit")
    run = resolve_run(spec, setup)
    p = run.param_plan.trainable_params
    terms = deepspeed_terms(run, OptimizerPlan(0, 0, 0))
    # the optimizer's own states (whatever they are) beside the master: what is left is the clone
    client = partition_optimizer_plan(run, -(-p // 2))
    assert terms.states - client.states == 4 * -(-p // 2)
