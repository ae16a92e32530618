"""The simulate engine end to end on tiny hand-written configs (seconds each).

Expected bytes are derived here from the config by hand: each parameter / state is one allocation,
rounded up to the caching allocator's 512-byte blocks.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.api import build_setup, estimate  # noqa: E402
from tuneplan.estimator.types import COMPONENTS  # noqa: E402
from tuneplan.simulate import SimulateUnavailable, simulate_breakdown, simulate_report  # noqa: E402
from tuneplan.specs.model import model_from_config  # noqa: E402

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

H, L, A, KV, F, V = 64, 2, 4, 2, 128, 256
TINY = dict(model_type="llama", hidden_size=H, num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=KV,
            intermediate_size=F, vocab_size=V, tie_word_embeddings=False)
D = H // A


def r512(n: int) -> int:
    return -(-n // 512) * 512


def linears() -> list[tuple[int, int]]:
    """(d_in, d_out) of the linears of one Llama layer."""
    return [(H, A * D), (H, KV * D), (H, KV * D), (A * D, H), (H, F), (H, F), (F, H)]


def param_numels() -> list[int]:
    per_layer = [i * o for i, o in linears()] + [H, H]  # + input / post-attention RMSNorm
    return per_layer * L + [V * H, V * H, H]  # embeddings, lm_head, final norm


@pytest.fixture(scope="module")
def tiny():
    return model_from_config(TINY, "tiny-llama-sim")


@pytest.fixture(scope="module")
def full_fp32(tiny):
    return simulate_report(tiny, build_setup(tiny, method="full", precision="fp32", seq=64, attn="eager",
                                             optimizer="adamw-fused", gradient_checkpointing=False))


def test_full_fp32_weights_and_fused_adamw_states(full_fp32) -> None:
    c = full_fp32.breakdown.components
    weights = sum(r512(4 * n) for n in param_numels())
    rope_buffers = 2 * r512(4 * D // 2)  # rotary inv_freq and original_inv_freq: head_dim / 2 fp32 each
    assert c["weights"] == weights + rope_buffers
    # fused AdamW: exp_avg + exp_avg_sq per parameter, and a device 'step' scalar per parameter
    assert c["optimizer_states"] == 2 * weights + 512 * len(param_numels())
    assert c["framework"] == 32 * 2**20  # the cuBLAS workspace, held from the first matmul
    assert full_fp32.peak_step == 2  # the steady peak: states exist only from step 1's update


def test_breakdown_is_consistent(full_fp32) -> None:
    bd = full_fp32.breakdown
    assert bd.engine == "simulate"
    assert set(bd.components) == set(COMPONENTS)
    assert bd.allocated_peak_bytes == sum(bd.components.values()) == max(bd.instants.values())
    assert bd.peak_instant in bd.instants
    assert bd.reserved_peak_bytes >= bd.allocated_peak_bytes
    assert full_fp32.allocator["max_allocated_bytes"] >= bd.allocated_peak_bytes
    assert full_fp32.peak_op


def test_gradient_checkpointing_keeps_less(tiny) -> None:
    kw = dict(method="lora", seq=256, attn="sdpa", batch=2)
    off = simulate_breakdown(tiny, build_setup(tiny, gradient_checkpointing=False, **kw))
    on = simulate_breakdown(tiny, build_setup(tiny, gradient_checkpointing=True, **kw))
    assert on.instants["forward"] < off.instants["forward"]


def test_lora_adapters_in_fp32_on_a_bf16_base(tiny) -> None:
    rep = simulate_report(tiny, build_setup(tiny, method="lora", rank=4, targets="q_proj,v_proj", seq=64,
                                            precision="bf16-mixed", gradient_checkpointing=False))
    c = rep.breakdown.components
    r = 4
    lora = [r * H, A * D * r, r * H, KV * D * r]  # A and B of q_proj and v_proj
    assert c["lora_adapters"] == L * sum(r512(4 * n) for n in lora)
    base = sum(r512(2 * n) for n in param_numels())
    assert base <= c["weights"] <= base + 1024  # frozen bf16 base (+ the two small RoPE buffers)
    assert c["gradients"] <= c["lora_adapters"]  # only adapters have gradients


def test_qlora_stand_in_holds_bitsandbytes_storage(tiny) -> None:
    rep = simulate_report(tiny, build_setup(tiny, method="qlora", rank=4, seq=64, double_quant=True))
    c = rep.breakdown.components
    meta = 0
    packed = 0
    for d_in, d_out in linears():
        n = d_in * d_out
        blocks = -(-n // 64)
        # NF4 code book (16 fp32), uint8 absmax per block, fp32 absmax per 256 blocks, 256 fp32 code, fp32 offset
        meta += r512(64) + r512(blocks) + r512(4 * -(-blocks // 256)) + r512(1024) + r512(4)
        packed += r512(n // 2)
    assert c["quant_meta"] == L * meta
    # prepare_model_for_kbit_training: everything not quantized is fp32
    rest = [H, H] * L + [V * H, V * H, H]
    assert L * packed + sum(r512(4 * n) for n in rest) <= c["weights"] <= L * packed + sum(
        r512(4 * n) for n in rest) + 1024


def test_api_engine_simulate_has_the_analytic_keys(tiny) -> None:
    kw = dict(method="lora", seq=64)
    sim = estimate(tiny, engine="simulate", **kw).to_dict()
    ana = estimate(tiny, engine="analytic", **kw).to_dict()
    assert sim["engine"] == "simulate" and ana["engine"] == "analytic"
    assert set(sim) == set(ana)
    assert set(sim["per_gpu"]) == set(ana["per_gpu"])
    assert set(sim["per_gpu"]["components"]) == set(ana["per_gpu"]["components"])


def test_multi_gpu_falls_back_to_analytic_with_a_note(tiny, monkeypatch) -> None:
    # ZeRO runs DeepSpeed's own engine: without deepspeed it is not simulated
    import tuneplan.simulate.zero as zero

    monkeypatch.setattr(zero, "deepspeed_version", lambda: "")
    rep = simulate_report(tiny, build_setup(tiny, method="full", seq=64, gpus=2, zero=2, offload="optimizer"))
    assert rep.fallback and rep.breakdown.engine == "analytic"
    assert rep.breakdown.notes[0].startswith("simulate: DeepSpeed ZeRO")


def test_missing_extra_is_a_clear_error(tiny, monkeypatch) -> None:
    import builtins

    real = builtins.__import__

    def no_peft(name, *a, **k):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(SimulateUnavailable) as err:
        simulate_breakdown(tiny, build_setup(tiny, method="lora", seq=64))
    assert err.value.field == "engine" and "peft" in str(err.value) and "simulate" in str(err.value)


def test_cli_simulate_json_and_snapshot(tmp_path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    snap = tmp_path / "snap.pickle"
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "simulate", str(cfg), "--method", "lora",
                        "--seq", "64", "--json", "--snapshot", str(snap)], capture_output=True, text=True,
                       timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["engine"] == "simulate"
    assert set(d["per_gpu"]["components"]) == set(COMPONENTS)
    assert d["simulation"]["peak_op"] and d["simulation"]["allocator_emulation"]["emulated"] is True
    from torch.cuda import _memory_viz

    data = pickle.loads(snap.read_bytes())
    assert "Summary of segments" in _memory_viz.segsum(data)
    allocs = [e for e in data["device_traces"][0] if e["action"] == "alloc"]
    assert allocs and all(e["frames"] for e in allocs)


def test_cli_simulate_bad_input_exits_2() -> None:
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "simulate", "no-such-model-xyz", "--json"],
                       capture_output=True, text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_classifier_head_copy_shares_the_fake_mode(tiny) -> None:
    """PEFT deep-copies a classifier head into modules_to_save. Copying the fake tensors' FakeTensorMode
    with it duplicated the mode's StorageWeakRef memo, whose entries were then freed twice at a garbage
    collection: an intermittent segfault / glibc abort. The copy must share the one mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tuneplan.simulate.build import build
    from tuneplan.specs.profiles import get_profile

    setup = build_setup(tiny, method="lora", precision="bf16-mixed", seq=32, num_labels=2)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = build(tiny, setup, get_profile("hf"), frozenset({"q_proj", "v_proj"}))
    copies = [p for n, p in model.named_parameters() if "modules_to_save" in n]
    originals = [p for n, p in model.named_parameters() if "original_module" in n]
    assert copies and originals
    assert all(p.fake_mode is fake for p in copies + originals)
    assert all(c is not o for c in copies for o in originals)  # a copy, not the same tensor
