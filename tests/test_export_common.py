"""export/common.py: what every recipe writer shares: refusals, the header, the launch line, plain keys."""

from __future__ import annotations

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan import estimate
from tuneplan.errors import TuneplanError
from tuneplan.export.common import (
    header_lines,
    launch_line,
    plain_keys,
    refuse_if_cannot_run,
    trainer_kernels,
)
from tuneplan.ingest.common import Collector, map_plain
from tuneplan.ingest.document import Document
from tuneplan.specs.fields import FORMATS
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup


@pytest.fixture(scope="module")
def tiny():
    return model_from_config(TINY_LLAMA, "tiny")


def test_launch_line():
    assert launch_line(TrainSetup(), "python train.py") == "python train.py"
    assert launch_line(TrainSetup(gpus=4), "train.py") == "torchrun --nproc_per_node 4 train.py"
    two_nodes = launch_line(TrainSetup(gpus=8, nodes=2), "train.py")
    assert two_nodes == ("torchrun --nproc_per_node 8 --nnodes 2 --node_rank $NODE_RANK "
                         "--master_addr $MASTER_ADDR train.py")
    # one process over several cards (device_map): no launcher
    assert launch_line(TrainSetup(gpus=2, device_map="auto"), "train.py") == "train.py"


@pytest.mark.parametrize("change, field", [({"activation_offload": True}, "activation_offload"),
                                           ({"loss": "chunked"}, "loss"), ({"loss": "fused"}, "loss"),
                                           ({"num_labels": 2}, "num_labels")])
def test_trainer_kernels_refuses_what_the_trainer_cannot_express(change, field):
    with pytest.raises(TuneplanError) as err:
        trainer_kernels(TrainSetup(**change), "the HF Trainer")
    assert err.value.field == field


def test_trainer_kernels_accepts_what_it_can():
    trainer_kernels(TrainSetup(loss="fused-linear"), "the HF Trainer")  # Liger's fused linear CE
    trainer_kernels(TrainSetup(), "the HF Trainer")


def test_plain_keys_by_hand():
    s = TrainSetup(method="lora", rank=8, batch=2, seq=1024, grad_accum=4)
    # alpha and dropout unset (None): left to the framework's default
    assert plain_keys(s, "llamafactory") == {"lora_rank": 8, "per_device_train_batch_size": 2,
                                             "cutoff_len": 1024, "gradient_accumulation_steps": 4}
    assert "lora_rank" not in plain_keys(s.replace(method="full"), "llamafactory")
    assert list(plain_keys(s, "deepspeed", ("grad_accum", "batch"))) == [
        "gradient_accumulation_steps", "train_micro_batch_size_per_gpu"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("setup", [
    TrainSetup(method="qlora", rank=32, alpha=16, dropout=0.05, batch=4, seq=2048, grad_accum=8,
               quant_type="fp4", double_quant=False, gradient_checkpointing=True, nodes=2),
    TrainSetup(method="full", batch=1, seq=512, grad_accum=1, nodes=1),
])
def test_plain_keys_read_back_as_the_same_fields(fmt, setup):
    # what a writer writes, a reader reads back: the same field table on both sides
    keys = plain_keys(setup, fmt)
    c = Collector(Document(path="f", data=keys, fmt="yaml"), fmt, fmt)
    map_plain(c, fmt, setup.method)
    assert c.out.fields == {name: getattr(setup, name) for name in c.out.fields}
    assert len(c.out.fields) == len(keys)


def test_header_lines_quote_the_estimate(tiny):
    est = estimate(tiny, gpu="rtx4090", method="lora", rank=8, batch=2, seq=256)
    lines = header_lines(est)
    assert lines[0].endswith("for tiny (0.00B params).")  # 3,283,200 parameters
    assert "batch 2 x seq 256" in lines[1] and "r=8" in lines[1] and "1 GPU(s) x 1 node(s)" in lines[1]
    assert "fits" in lines[2] and "GiB device" in lines[2] and "GiB allocated" in lines[2]


def test_a_plan_the_card_cannot_run_is_refused_with_the_fix(tiny):
    est = estimate(tiny, gpu="t4", method="lora", precision="bf16-mixed")  # T4: compute capability 7.5
    with pytest.raises(TuneplanError) as err:
        refuse_if_cannot_run(est)
    assert err.value.field == "bf16-unsupported" and "fp16-mixed" in err.value.accepted
    refuse_if_cannot_run(estimate(tiny, gpu="t4", method="lora", precision="fp16-mixed"))
