"""export/accelerate_yaml.py: the accelerate config for the plan's GPUs and sharding, read back by the
accelerate reader (ingest/accelerate.py) as the same setup."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import TINY_LLAMA
from tuneplan import estimate
from tuneplan.errors import TuneplanError
from tuneplan.export.accelerate_yaml import accelerate_config, render_accelerate
from tuneplan.ingest.accelerate import read_accelerate
from tuneplan.ingest.document import Document
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup


@pytest.fixture(scope="module")
def tiny():
    return model_from_config(TINY_LLAMA, "tiny")


def read_back(cfg: dict) -> dict:
    return read_accelerate(Document(path="acc.yaml", data=cfg, fmt="yaml")).fields


@pytest.mark.parametrize("setup", [
    TrainSetup(gpus=1),
    TrainSetup(gpus=4, precision="fp16-mixed"),
    TrainSetup(gpus=8, nodes=2),
    TrainSetup(gpus=4, fsdp=True, gradient_checkpointing=True),
    TrainSetup(gpus=4, fsdp=True, fsdp_version=2, offload="all", gradient_checkpointing=False),
])
def test_round_trip_through_the_reader(tiny, setup):
    fields = read_back(accelerate_config(tiny, setup))
    assert (fields.get("gpus", 1), fields.get("nodes", 1)) == (setup.gpus, setup.nodes)
    assert fields["fsdp"] is setup.fsdp and fields["zero"] == 0
    if setup.precision.endswith("-mixed"):
        assert fields["precision"] == setup.precision
    if setup.fsdp:
        assert fields["fsdp_version"] == setup.fsdp_version
        assert fields["offload"] == setup.offload
        assert fields["gradient_checkpointing"] is bool(setup.gradient_checkpointing)


def test_num_processes_is_the_total_over_machines(tiny):
    # accelerate ClusterConfig: num_processes counts every machine's processes: 8 x 2 = 16
    cfg = accelerate_config(tiny, TrainSetup(gpus=8, nodes=2))
    assert (cfg["num_processes"], cfg["num_machines"]) == (16, 2)
    assert cfg["main_process_port"] == 29500 and cfg["distributed_type"] == "MULTI_GPU"


def test_deepspeed_points_at_its_json(tiny):
    cfg = accelerate_config(tiny, TrainSetup(gpus=4, zero=3), deepspeed_file="z3.json")
    assert cfg["distributed_type"] == "DEEPSPEED"
    assert cfg["deepspeed_config"] == {"deepspeed_config_file": "z3.json", "zero3_init_flag": True}
    assert cfg["mixed_precision"] == "bf16"  # agrees with the DeepSpeed JSON's bf16 section


def test_pure_16_bit_needs_no_autocast(tiny):
    assert accelerate_config(tiny, TrainSetup(precision="bf16"))["mixed_precision"] == "no"


def test_fsdp_has_no_optimizer_only_offload(tiny):
    with pytest.raises(TuneplanError) as err:
        accelerate_config(tiny, TrainSetup(gpus=2, fsdp=True, offload="optimizer"))
    assert err.value.field == "offload"


def test_render_is_commented_yaml_of_the_config(tiny):
    est = estimate(tiny, gpu="rtx4090", gpus=2, method="lora")
    text = render_accelerate(est)
    assert all(line.startswith("# ") for line in text.splitlines() if not line[:1].isalpha())
    assert "accelerate launch --config_file" in text
    assert yaml.safe_load(text) == accelerate_config(est.model, est.setup, est.gpu)
