"""measure: real steps on this machine (CPU in CI), the calibration record, and its column format."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tuneplan.errors import TuneplanError
from tuneplan.measure import MEASURED_COLUMNS, append_record
from tuneplan.specs.model import model_from_config

pytest.importorskip("torch", reason="measure needs the simulate extra (torch, transformers, peft)")
pytest.importorskip("transformers", reason="measure needs the simulate extra")
pytest.importorskip("peft", reason="measure needs the simulate extra")

from tuneplan.measure import measure  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_CANDIDATES = (REPO.parent / "shared" / "calibration" / "measured.csv",
                     REPO / "benchmarks" / "data" / "calibration" / "measured.csv")

# 2 layers, hidden 64, 4 heads of 16, 2 KV heads (GQA), SwiGLU 128, vocab 256, untied head.
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 512, "tie_word_embeddings": False}
# Hand count: per layer q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12288; gate/up/down 3*64*128 = 24576;
# two RMSNorms 2*64 = 128 -> 36992. Embedding 256*64 = 16384, lm_head 16384, final norm 64.
TINY_LAYER = 12288 + 24576 + 128
TINY_TOTAL = 2 * TINY_LAYER + 16384 + 16384 + 64
# LoRA r=16 on q_proj (64->64) and v_proj (64->32), PEFT's default targets for llama, two layers.
TINY_LORA_R16 = 2 * (16 * (64 + 64) + 16 * (64 + 32))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    p = tmp_path_factory.mktemp("tiny") / "config.json"
    p.write_text(json.dumps(TINY))
    return str(p)


def test_columns_equal_the_shared_calibration_header() -> None:
    found = [p for p in SHARED_CANDIDATES if p.exists()]
    assert found, "benchmarks/data/calibration/measured.csv (the in-repo copy) is missing"
    for p in found:
        with p.open(newline="", encoding="utf-8") as f:
            assert tuple(next(csv.reader(f))) == MEASURED_COLUMNS, p


def test_tiny_model_spec_matches_the_hand_count() -> None:
    assert model_from_config(TINY).params_total == TINY_TOTAL == 106816


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == MEASURED_COLUMNS
        return list(reader)


def test_lora_on_cpu_writes_a_valid_record_and_appends(tiny_path: str, tmp_path: Path) -> None:
    rec = tmp_path / "runs" / "measured_here.csv"
    out = measure(tiny_path, steps=2, device="cpu", record=rec, method="lora", rank=16, batch=2, seq=32)
    m = out["measured"]
    assert m["outcome"] == "measured" and m["memory_kind"] == "host"
    assert m["trainable_params"] == TINY_LORA_R16 == 7168
    assert len(m["step_seconds"]) == 2 and m["tokens_per_s"] > 0
    assert m["peak_bytes"] >= max(m["phase_peaks"].values()) > 0
    rows = _rows(rec)
    assert len(rows) == 1
    r = rows[0]
    assert r["method"] == "lora" and r["lora_rank"] == "16" and r["trainable_params"] == "7168"
    assert r["micro_batch_size"] == "2" and r["seq_len"] == "32" and r["n_gpus"] == "0"
    assert "host" in r["peak_mem_metric"] and "not GPU memory" in r["peak_mem_metric"]
    assert r["peak_mem_unit"] == "GiB" and float(r["peak_mem_value"]) == float(r["peak_mem_gib_derived"])
    assert r["peak_mem_alt_value"] == "" and r["outcome"] == "measured"
    assert float(r["throughput_value"]) > 0 and r["source_group"] == "tuneplan-measure"
    assert "est_allocated_gib=" in r["notes"]
    # A second run appends below the first; the header is written once.
    before = rec.read_text()
    measure(tiny_path, steps=1, device="cpu", record=rec, method="full", batch=1, seq=16, attn="eager")
    after = rec.read_text()
    assert after.startswith(before)
    rows = _rows(rec)
    assert [x["method"] for x in rows] == ["lora", "full"]
    assert rows[1]["trainable_params"] == str(TINY_TOTAL)
    assert rows[1]["attention_impl"] == "eager"


def test_classifier_head_runs_with_one_label_per_sequence(tiny_path: str) -> None:
    # LlamaForSequenceClassification: LoRA r=8 on q,v (half the r=16 count) plus PEFT's trainable copy of the
    # score head (hidden 64 x 3 labels, no bias)
    out = measure(tiny_path, steps=1, device="cpu", method="lora", rank=8, num_labels=3, batch=2, seq=16)
    m = out["measured"]
    assert m["outcome"] == "measured" and m["peak_bytes"] > 0
    assert m["trainable_params"] == TINY_LORA_R16 // 2 + 64 * 3


def test_freeze_trains_only_the_last_layers(tiny_path: str) -> None:
    out = measure(tiny_path, steps=1, device="cpu", method="freeze", freeze_trainable_layers=1, seq=16)
    assert out["measured"]["trainable_params"] == TINY_LAYER


def test_comparison_pairs_measured_with_the_estimate_of_the_same_setup(tiny_path: str) -> None:
    out = measure(tiny_path, steps=2, device="cpu", method="lora", seq=16)
    est = out["estimate"]["per_gpu"]
    rows = {r["quantity"]: r for r in out["comparison"]}
    assert rows["allocated peak"]["estimated_bytes"] == est["allocated_peak_bytes"]
    assert rows["peak during forward + loss"]["estimated_bytes"] == est["instants"]["forward"]
    c = est["components"]
    assert rows["weights + quantized storage + adapters (before step 1)"]["estimated_bytes"] == (
        c["weights"] + c["quant_meta"] + c["lora_adapters"])
    assert all("host RSS" in r["note"] for r in out["comparison"])  # CPU figures are labelled


def test_refuses_a_file_with_other_columns_and_leaves_it_untouched(tmp_path: Path) -> None:
    p = tmp_path / "mine.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TuneplanError) as err:
        append_record(p, dict.fromkeys(MEASURED_COLUMNS, ""))
    assert err.value.field == "record"
    assert p.read_text() == "a,b,c\n1,2,3\n"


def test_measure_checks_the_record_file_before_running(tiny_path: str, tmp_path: Path) -> None:
    p = tmp_path / "mine.csv"
    p.write_text("a,b,c\n")
    with pytest.raises(TuneplanError) as err:
        measure(tiny_path, steps=1, device="cpu", record=p)
    assert err.value.field == "record" and p.read_text() == "a,b,c\n"
    with pytest.raises(TuneplanError) as err:
        measure(tiny_path, steps=1, device="cpu", weights=str(tmp_path / "absent"))
    assert err.value.field == "weights"


def test_append_adds_a_missing_final_newline(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_text(",".join(MEASURED_COLUMNS))  # header without a trailing newline
    append_record(p, {k: "x" for k in MEASURED_COLUMNS})
    assert len(_rows(p)) == 1


@pytest.mark.parametrize("fields, field", [
    ({"method": "qlora"}, "method"),
    ({"optimizer": "paged-adamw-8bit"}, "optimizer"),
    ({"attn": "flash"}, "attn"),
    ({"gpus": 2, "zero": 2}, "gpus"),
    ({"framework": "torchtune"}, "framework"),
])
def test_cpu_refuses_gpu_only_setups_naming_the_field(tiny_path: str, fields: dict, field: str) -> None:
    with pytest.raises(TuneplanError) as err:
        measure(tiny_path, steps=1, device="cpu", **fields)
    assert err.value.field == field


def test_bad_steps_and_device(tiny_path: str) -> None:
    with pytest.raises(TuneplanError) as err:
        measure(tiny_path, steps=0, device="cpu")
    assert err.value.field == "steps"
    with pytest.raises(TuneplanError) as err:
        measure(tiny_path, steps=1, device="tpu")
    assert err.value.field == "device"


def test_cli_json_and_record(tiny_path: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tuneplan.cli.app import app

    rec = tmp_path / "cli.csv"
    res = CliRunner().invoke(app, ["measure", tiny_path, "--steps", "2", "--seq", "16", "--device", "cpu",
                                   "--record", str(rec), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["record_path"] == str(rec) and d["measured"]["steps"] == 2
    assert len(_rows(rec)) == 1


def test_the_model_output_is_freed_before_backward_as_the_trainer_does(tiny_path: str, monkeypatch) -> None:
    """Trainer.compute_loss hands training_step the loss alone, so the logits (batch x seq x vocab) are
    not alive during backward. A runner that keeps the output object adds them to the backward peak: on
    an H200 that showed as 2 bytes x vocab per token above the estimate of every LoRA run."""
    import weakref

    import torch

    import tuneplan.measure.runner as runner

    logits_refs: list = []
    alive_at_backward: list[bool] = []
    real_build, real_backward = runner.build_model, torch.Tensor.backward

    def build(*args, **kwargs):
        built = real_build(*args, **kwargs)
        built.model.register_forward_hook(lambda m, i, out: logits_refs.append(weakref.ref(out.logits)))
        return built

    def backward(self, *args, **kwargs):
        alive_at_backward.append(logits_refs[-1]() is not None)
        return real_backward(self, *args, **kwargs)

    monkeypatch.setattr(runner, "build_model", build)
    monkeypatch.setattr(torch.Tensor, "backward", backward)
    measure(tiny_path, steps=2, device="cpu", method="lora", seq=32)
    assert alive_at_backward == [False, False]


def test_on_a_gpu_the_allocator_figures_are_ordered(tiny_path: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (benchmarks/gpu_sweep.sh runs the GPU measurements)")
    out = measure(tiny_path, steps=2, device="cuda", method="lora", seq=64)
    m = out["measured"]
    assert m["memory_kind"] == "cuda"
    assert m["reserved_peak_bytes"] >= m["peak_bytes"] >= m["after_step_bytes"] >= m["persistent_bytes"] > 0
    assert out["record"]["peak_mem_metric"] == "torch.cuda.max_memory_allocated"


def test_nvml_sampler_matches_the_torch_device_by_uuid_and_reports_above_baseline(monkeypatch) -> None:
    """A stand-in pynvml with two GPUs: torch's cuda:0 is NVML's second device (CUDA_VISIBLE_DEVICES=1)."""
    import sys
    import types

    from tuneplan.measure.counters import open_nvml

    used = {"GPU-a": 5 * 2**30, "GPU-b": 1 * 2**30}  # another process holds 5 GiB on the first card
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: ["GPU-a", "GPU-b"][i],
        nvmlDeviceGetUUID=lambda h: h.encode(),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=used[h]),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=0, usedGpuMemory=None)],
        nvmlSystemGetDriverVersion=lambda: b"555.42",
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    torch_like = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_device_properties=lambda i: types.SimpleNamespace(uuid="b")))
    s = open_nvml(torch_like, 0)
    assert s is not None and s.baseline == 1 * 2**30 and s.driver == "555.42"
    used["GPU-b"] += 3 * 2**30  # this process's context and pool
    s.sample()
    used["GPU-b"] -= 1 * 2**30
    s.sample()
    assert s.peak_delta == 3 * 2**30  # the peak above the pre-run reading, other cards ignored
    assert s.peak_process is None  # our pid is not visible (as in a container)
