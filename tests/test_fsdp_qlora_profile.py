"""The fsdp-qlora profile (Answer.AI's fsdp_qlora train.py) against the script's own argument defaults
(tests/fixtures/fsdp_qlora_train_args.json, read from train.py at the commit it names) and counts made by
hand from what the script builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuneplan.api import estimate
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.wrappers.fsdp import fsdp_layers_gathered
from tuneplan.specs.profiles import get_profile, loss_kind

ROOT = Path(__file__).resolve().parents[1]
TRAIN_ARGS = json.loads((ROOT / "tests" / "fixtures" / "fsdp_qlora_train_args.json").read_text())
ARGS = TRAIN_ARGS["arguments"]
LLAMA2_7B = "meta-llama/Llama-2-7b-hf"


def _sharded(**kw: object):
    base = dict(framework="fsdp-qlora", method="qlora", gpus=2, fsdp=True, timing=False)
    return estimate(resolve_model(LLAMA2_7B, allow_network=False), **{**base, **kw})


def test_profile_defaults_are_the_scripts() -> None:
    p = get_profile("fsdp-qlora")
    assert ARGS["precision"]["default"] == "bf16" and p.default_precision == "bf16"
    assert ARGS["lora_rank"]["default"] == p.default_rank == 64
    assert ARGS["lora_dropout"]["default"] == p.default_dropout == 0.1
    assert ARGS["optimizer"]["default"] == "adamw" == p.default_optimizer == p.default_optimizer_qlora
    assert ARGS["use_gradient_checkpointing"]["default"] is True
    assert p.gc_full and p.gc_lora and p.gc_qlora
    assert ARGS["lora_target_modules"]["default"] == "all"
    assert p.default_targets.split(",") == TRAIN_ARGS["lora_target_modules_all"]
    # pure bf16: no autocast, no fp32 upcast of the non-quantized weights (no prepare_model_for_kbit_training)
    assert not p.autocast and not p.kbit_upcast_fp32 and not p.quantizes_lm_head


def test_resolved_setup_takes_the_defaults_and_keeps_the_users() -> None:
    s = _sharded().setup
    got = (s.rank, s.dropout, s.precision, s.optimizer, s.gradient_checkpointing)
    assert got == (64, 0.1, "bf16", "adamw", True)
    assert s.targets == "k_proj,q_proj,v_proj,up_proj,down_proj,gate_proj"
    assert s.sources["rank"] == "fsdp-qlora profile default"
    assert _sharded(rank=16).setup.rank == 16
    # other profiles keep the setup's own rank default
    assert estimate(resolve_model(LLAMA2_7B, allow_network=False), timing=False).setup.rank == 16


def test_trainable_params_by_hand() -> None:
    # Llama-2-7B, r=64 on q, k, v (4096 -> 4096), gate, up (4096 -> 11008), down (11008 -> 4096); 32 layers;
    # o_proj is not in train.py's "all"
    per_layer = 3 * 64 * (4096 + 4096) + 2 * 64 * (4096 + 11008) + 64 * (11008 + 4096)
    assert _sharded().trainable_params == 32 * per_layer == 143_130_624


def test_each_adapter_is_a_unit_so_one_layer_is_unsharded_in_backward() -> None:
    # train.py get_wrapping_policy: _or_policy(leaf modules whose weight requires grad, decoder layers):
    # every LoRA A / B is an FSDP unit of its own, as with PEFT's fsdp_auto_wrap_policy
    assert fsdp_layers_gathered(_sharded().setup) == 1
    assert fsdp_layers_gathered(_sharded(framework="litgpt").setup) == 2


def test_loss_chain_of_transformers_4_37_to_4_45() -> None:
    # LlamaForCausalLM.forward: logits.float() (kept in the output through backward) and a contiguous fp32
    # shifted copy; loss backward: fp32 logits, saved log-softmax, nll and log-softmax gradients: 16 B per
    # logit, and the loop drops the output after the step (nothing held into the next forward)
    est = _sharded(batch=1, seq=2048)
    assert loss_kind(est.setup, get_profile("fsdp-qlora")) == "torchtune_legacy"
    assert not get_profile("fsdp-qlora").loop_holds_outputs
    assert est.breakdown.components["logits_loss"] == 16 * 2048 * 32000


def test_no_quant_storage_warning_train_py_sets_it() -> None:
    codes = {f.code for f in _sharded().findings}
    assert "qlora-sharded-quant-storage" not in codes
    assert "qlora-sharded-quant-storage" in {f.code for f in _sharded(framework="hf").findings}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=os.fspath(ROOT))


def test_cli_estimate_with_the_profile() -> None:
    r = _cli("estimate", LLAMA2_7B, "--framework", "fsdp-qlora", "--gpus", "2", "--fsdp", "--method", "qlora",
             "--seq", "2048", "--gpu", "rtx3090", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["setup"]["framework"] == "fsdp-qlora" and d["setup"]["rank"] == 64
    assert d["setup_sources"]["precision"] == "fsdp-qlora profile default"


@pytest.mark.parametrize("bad", ["fsdp_qlora", "answerai"])
def test_cli_refuses_an_unknown_framework_naming_the_accepted(bad: str) -> None:
    r = _cli("estimate", LLAMA2_7B, "--framework", bad, "--json")
    assert r.returncode == 2
    d = json.loads(r.stdout)
    assert "fsdp-qlora" in json.dumps(d) and "Traceback" not in r.stderr


def test_planner_space_holds_only_what_train_py_runs() -> None:
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.plan.space import METHOD_VARIANTS, families

    fams = families(list(METHOD_VARIANTS), {"framework": "fsdp-qlora"}, 2, resolve_accelerator("rtx3090"))
    # train.py: --train_type full / lora / qlora (4-bit), FSDP with or without CPU offload or one GPU, and
    # --optimizer adamw / adam / sgd / adadelta (no bitsandbytes optimizer)
    assert {f.method for f in fams} == {"full", "lora", "qlora-4"}
    assert {f.strategy for f in fams} == {"fsdp", "fsdp+offload-all"}
    assert {f.optimizer for f in fams} == {None}
    hf = families(list(METHOD_VARIANTS), {"framework": "hf"}, 2, resolve_accelerator("rtx3090"))
    assert {"qlora-8", "freeze"} <= {f.method for f in hf} and "adamw-8bit" in {f.optimizer for f in hf}


def test_offloaded_units_keep_no_device_copy_of_their_shard() -> None:
    # train.py wraps with use_orig_params=False: pre_unshard's device copy of a host shard is referenced only
    # by flat_param, which unshard points at the all-gather output, so nothing is left beside the unsharded
    # units at the loss. The HF Trainer (use_orig_params=True) keeps its parameters as views of that copy
    # until the unit reshards: 1/2 of the unsharded root and layer more on each of 2 GPUs. The one copy
    # train.py's run makes beside a unit is the root's at its pre-backward (reshard() pointed flat_param back
    # at the host shard; unshard() then reuses the kept storage): Llama-2-7B's root, 2 x 32000 x 4096 + 4096
    # bf16, and half of it, where this small batch peaks
    root = (2 * 32000 * 4096 + 4096) * 2
    offloaded = _sharded(offload="all", batch=1, seq=512).breakdown
    assert offloaded.peak_instant == "backward_root_pre"
    assert offloaded.components["parallel_buffers"] == root + root // 2
    # (read at the loss: offloaded, the HF run's peak is a later layer's end, beside the next layer)
    hf = {off: _hf_at_loss(off) for off in ("none", "all")}
    assert hf["all"] == hf["none"] + -(-hf["none"] // 2)


def _hf_at_loss(offload: str) -> int:
    """The HF Trainer's gathered units (and their device copies) at the loss, QLoRA Llama-2-7B on 2 GPUs."""
    from tuneplan.api import build_setup, resolve_run
    from tuneplan.estimator.instants import memory_at, named

    spec = resolve_model(LLAMA2_7B, allow_network=False)
    run = resolve_run(spec, build_setup(spec, method="qlora", framework="hf", gpus=2, fsdp=True,
                                        offload=offload, batch=1, seq=512))
    return int(named(memory_at(run, 1, 512).rows["backward_start"]).parallel_buffers)


def test_offloaded_adapters_are_on_the_host() -> None:
    # CPUOffload(offload_params=True) offloads every flat parameter, the LoRA units' too: r=64 adapters of
    # Llama-2-7B (143,130,624 parameters, test_trainable_params_by_hand) in bf16, halved over 2 GPUs
    adapter_shard = 143_130_624 * 2 // 2
    on = _sharded(offload="none").breakdown
    off = _sharded(offload="all").breakdown
    assert on.components["lora_adapters"] == adapter_shard
    assert off.components["lora_adapters"] == 0
    assert off.host_bytes >= adapter_shard


def test_the_pre_unshard_streams_shard_copies_by_hand() -> None:
    # Llama-2-7B LoRA, CPU offload, 2 GPUs, bf16. The root unit: embed_tokens and lm_head (32000 x 4096) and
    # the final norm (4096) = 262,148,096 parameters, 524,296,192 B, a 262,148,096 B shard: 4 KiB over
    # 250 MiB, a 252 MiB segment. A decoder layer: q, k, v, o 4096 x 4096, gate, up, down 11008 x 4096 and
    # two norms of 4096 = 202,383,360 parameters, a 202,383,360 B shard: a 194 MiB segment
    from tuneplan.api import build_setup
    from tuneplan.estimator.run import resolve_run
    from tuneplan.estimator.wrappers.fsdp1_offload import freed_shard_copies

    spec = resolve_model(LLAMA2_7B, allow_network=False)

    def copies(**kw: object) -> int:
        base = dict(framework="fsdp-qlora", method="lora", gpus=2, fsdp=True, offload="all")
        return freed_shard_copies(resolve_run(spec, build_setup(spec, **{**base, **kw})))

    assert copies() == (252 + 194) * 2**20
    assert copies(offload="none") == 0
    assert copies(framework="hf") == 0  # use_orig_params=True: the copies are held, counted as allocated


def test_two_layers_unsharded_at_a_layers_backward_end() -> None:
    # each adapter its own unit: a layer's first adapter (in forward order) starts its backward after the
    # layer's matmuls and prefetches the next layer (BACKWARD_PRE), so the layer's end has two layers
    # unsharded beside the root. Llama-2-7B LoRA in bf16 at 1 x 512 tokens, where little else is live:
    # the root (embed_tokens, lm_head 32000 x 4096, final norm 4096) = 524,296,192 B and two layers of
    # 202,383,360 parameters (test_the_pre_unshard_streams_shard_copies_by_hand) = 404,766,720 B each
    b = _sharded(method="lora", batch=1, seq=512).breakdown
    assert b.peak_instant == "backward_layer_end"
    assert b.components["parallel_buffers"] == 524_296_192 + 2 * 404_766_720
