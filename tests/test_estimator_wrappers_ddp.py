"""estimator/wrappers/ddp.py: DDP's replica, its gradient buckets and its all-reduce; one GPU unwrapped."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan.estimator.links import Link
from tuneplan.estimator.optimizer import OptimizerPlan
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.base import NCCL_BYTES, Collectives
from tuneplan.estimator.wrappers.ddp import DDP_BUCKET_BYTES, Ddp
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup

# tiny llama: embeddings 1000 * 256 = 256,000; lm_head (untied) 256,000; per layer q,o 2 * 256 * 256
# = 131,072, k,v 2 * 256 * 64 = 32,768, gate,up,down 3 * 256 * 688 = 528,384, two RMSNorms 512:
# 692,736 x 4 layers = 2,770,944; final norm 256. Total 3,283,200 parameters.
TINY_PARAMS = 256_000 + 256_000 + 4 * 692_736 + 256
OPT = OptimizerPlan(states=123, paged=0, temp=45)


def full_bf16(**kw):
    model = model_from_config(TINY_LLAMA, "tiny")
    return resolve_run(model, TrainSetup(method="full", precision="bf16", optimizer="adamw", **kw))


@pytest.mark.parametrize("setup, applies", [
    (TrainSetup(), True),
    (TrainSetup(gpus=8), True),
    (TrainSetup(gpus=8, zero=2), False),
    (TrainSetup(gpus=8, fsdp=True), False),
])
def test_applies_without_zero_or_fsdp(setup, applies):
    assert Ddp.applies(setup) is applies


def test_the_run_counts_every_parameter_trainable():
    run = full_bf16()
    assert run.param_plan.trainable_params == TINY_PARAMS
    assert run.param_plan.trainable_bytes == 2  # pure bf16: no fp32 master


def test_one_gpu_is_unwrapped():
    run = full_bf16()
    mem = Ddp().memory(run, OPT)
    r = mem.resident
    assert r.gradients == TINY_PARAMS * 2  # one bf16 gradient per parameter
    assert (r.states, r.optimizer_temp) == (123, 45)  # the optimizer plan passes through
    assert r.nccl == 0 and r.host == 0
    assert mem.buckets.persistent == 0 and mem.notes == ()
    assert r.weights + r.adapters == run.param_plan.weight_bytes + run.param_plan.adapter_bytes


def test_two_gpus_add_buckets_the_size_of_the_gradients_and_nccl():
    run = full_bf16(gpus=2)
    mem = Ddp().memory(run, OPT)
    assert mem.buckets.persistent == TINY_PARAMS * 2  # gradient_as_bucket_view=False: a second copy
    assert mem.resident.nccl == NCCL_BYTES == 512 * 1024**2
    assert mem.notes


def test_collectives_none_on_one_gpu():
    run = full_bf16()
    link = Link("test", 10.0, "by hand")
    assert Ddp().collectives(run, grad_bytes=2, gathered_bytes=0, link=link) == Collectives()


@pytest.mark.parametrize("gpus, factor", [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_all_reduce_once_per_step_by_hand(gpus, factor):
    # a ring all-reduce sends 2 (n - 1) / n bytes per byte of the gradients (NCCL's bus-bandwidth factor)
    run = full_bf16(gpus=gpus)
    link = Link("test", 10.0, "by hand")  # 10 GB/s one direction
    c = Ddp().collectives(run, grad_bytes=2, gathered_bytes=0, link=link)
    assert c.per_step == pytest.approx(TINY_PARAMS * 2 * factor / 10e9)
    assert c.per_micro_batch == 0.0 and c.serial == 0.0


def test_the_exposed_last_bucket_is_ddps_bucket_cap():
    # torch DistributedDataParallel bucket_cap_mb=25
    assert Ddp().last_bucket_bytes(full_bf16(gpus=2), 2) == DDP_BUCKET_BYTES == 25 * 2**20


def test_gradient_wire_bytes_follow_the_trainable_dtype():
    assert Ddp().gradient_wire_bytes(full_bf16(gpus=2)) == 2
