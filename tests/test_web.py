"""The web page's callbacks without a browser (and without gradio): form values in, HTML out.

The page must show the core's numbers and nothing of its own: verdicts and chart figures are checked
against the CLI's JSON and against hand-derived card sizes; every bad input must come back as a
message in the slot next to its fields, never as an exception.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_LLAMA
from tuneplan.specs.setup import TrainSetup
from tuneplan.web import callbacks, form, views
from tuneplan.web.form import DEFAULTS

# the package these tests imported, so the CLI compared with the page is this checkout's
SRC = str(Path(callbacks.__file__).resolve().parents[2])

GIB = 2**30
# GeForce RTX 4090: 24 GB marketed (gpus.csv), no observed figure, so the usable memory is
# 24 GiB x 0.99 (specs/hardware.py USABLE_FRACTION) = 25512105738.24 bytes -> 25512105738 = 23.76 GiB.
RTX4090_BYTES = 25_512_105_738


def view(**changes):
    return callbacks.estimate_view({**DEFAULTS, **changes})


def attr(html: str, name: str) -> str:
    m = re.search(rf'{name}="([^"]*)"', html)
    assert m, f"{name} not in {html[:200]}"
    return m.group(1)


def segments(svg: str) -> dict[str, int]:
    return {c: int(b) for c, b in re.findall(r'data-component="([^"]+)" data-bytes="(\d+)"', svg)}


def cli_json(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", *args, "--json"],
                       capture_output=True, text=True, timeout=120,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": SRC})
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_page_shows_the_cli_numbers() -> None:
    """Same model, setup and card: the page's estimate is the CLI's, field for field (no second engine)."""
    values = {**DEFAULTS, "method": "lora", "rank": 32, "seq": 1024, "batch": 2, "gpu": "a100-80gb-sxm4",
              "precision": "bf16-mixed", "gradient_checkpointing": "on"}
    page = callbacks.estimate_dict(values)
    cli = cli_json(values["model"], "--method", "lora", "--rank", "32", "--seq", "1024", "--batch", "2",
                   "--gpu", "a100-80gb-sxm4", "--precision", "bf16-mixed", "--gradient-checkpointing")
    for key in ("per_gpu", "peak_instant", "gpu", "fits", "headroom_bytes", "findings", "model"):
        assert page[key] == cli[key], key
    assert page["setup"] == cli["setup"]


def test_default_form_fits_a_4090_and_the_chart_adds_up() -> None:
    out = view()
    assert all(out[f"{g}_msg"] == "" for g in form.GROUPS)
    assert attr(out["verdict"], "data-verdict") == "FITS"
    d = callbacks.estimate_dict(dict(DEFAULTS))
    svg = out["chart"]
    assert int(attr(svg, "data-capacity-bytes")) == RTX4090_BYTES
    assert "GeForce RTX 4090: 23.76 GiB" in svg
    # The stacked segments partition the device peak: components (= allocated) + allocator cache
    # (reserved - allocated) + CUDA context + NCCL = reserved + context + NCCL = device peak.
    segs = segments(svg)
    assert sum(segs.values()) == int(attr(svg, "data-device-peak-bytes")) == d["per_gpu"]["device_peak_bytes"]
    for name, n in d["per_gpu"]["components"].items():
        assert segs.get(name, 0) == n
    assert f"{(RTX4090_BYTES - d['per_gpu']['device_peak_bytes']) / GIB:,.2f} GiB headroom" in out["verdict"]


def test_full_fine_tune_of_7b_does_not_fit_24gb() -> None:
    # Full fine-tuning with AdamW under mixed precision keeps >= 16 bytes per parameter (fp32 master,
    # two fp32 moments, 16-bit weights and grads; ZeRO paper, Rajbhandari et al. 2020, sec. 3.1):
    # 7.6e9 x 16 B = 122 GB, five times a 24 GB card.
    out = view(method="full")
    assert attr(out["verdict"], "data-verdict") == "DOES NOT FIT"
    peak = int(attr(out["chart"], "data-device-peak-bytes"))
    assert peak > 7.6e9 * 16
    assert "short by" in out["verdict"]
    assert 'stroke="#cf222e"' in out["chart"]  # the capacity line turns red when the bar passes it


def test_changing_a_field_changes_verdict_and_chart() -> None:
    a, b = view(), view(method="full")
    assert attr(a["verdict"], "data-verdict") != attr(b["verdict"], "data-verdict")
    assert attr(a["chart"], "data-device-peak-bytes") != attr(b["chart"], "data-device-peak-bytes")


def test_no_gpu_gives_memory_only() -> None:
    out = view(gpu="")
    assert attr(out["verdict"], "data-verdict") == "MEMORY ONLY"
    assert attr(out["chart"], "data-capacity-bytes") == ""


def test_cluster_verdict_is_per_gpu() -> None:
    out = view(method="full", gpus=8, zero="3", gpu="a100-80gb-sxm4")
    assert out["hardware_msg"] == ""
    assert "per GPU, 8 GPUs" in out["verdict"]


@pytest.mark.parametrize("changes,slot,needle", [
    ({"rank": 0}, "setup", "LoRA rank"),  # the page's label for the field, not the CLI's name
    ({"rank": 1.5}, "setup", "whole number"),
    ({"seq": None}, "setup", "Tokens per sample (cutoff_len): is empty"),
    ({"batch": -3}, "setup", "Micro-batch per GPU"),
    ({"gpu": "rtx9999"}, "hardware", "did you mean"),
    # ZeRO on one GPU: the core's own rule, routed to the hardware fields
    ({"zero": "2"}, "hardware", "DeepSpeed ZeRO stage"),
    ({"offload": "optimizer"}, "hardware", "CPU offload"),
    ({"model": "qwen2.5-7x"}, "model", "did you mean"),
    ({"model": ""}, "model", "choose a model"),
    ({"model": "/etc/some/config.json"}, "model", "does not read files on the server"),
    ({"config_text": "{not json"}, "model", "not valid JSON (line 1"),
    ({"config_text": '{"model_type": "llama"}'}, "model", "hidden_size"),
])
def test_bad_input_is_a_message_next_to_its_fields(changes, slot, needle) -> None:
    out = view(**changes)
    assert needle in out[f"{slot}_msg"], out
    others = [g for g in form.GROUPS if g != slot]
    assert all(out[f"{g}_msg"] == "" for g in others), out
    assert attr(out["verdict"], "data-verdict") == "INPUT ERROR"
    assert out["chart"] == ""


def test_several_bad_fields_each_get_their_message() -> None:
    out = view(rank=0, gpu="nope-gpu", model="nope-model")
    assert "rank" in out["setup_msg"] and "gpu" in out["hardware_msg"] and "model" in out["model_msg"]


def test_bad_dataset_does_not_hide_the_memory_verdict() -> None:
    out = view(samples=0, epochs=-1)
    assert "Samples" in out["dataset_msg"]
    assert attr(out["verdict"], "data-verdict") == "FITS"


def test_bits_only_apply_to_qlora_as_on_the_cli() -> None:
    # The bits widget is hidden unless the method is QLoRA; a stale value there must not become --bits.
    assert form.setup_kwargs({**DEFAULTS, "method": "lora", "bits": "8"}).get("bits") is None
    assert form.setup_kwargs({**DEFAULTS, "method": "qlora", "bits": "8"})["bits"] == 8
    assert "rank" not in form.setup_kwargs({**DEFAULTS, "method": "full"})


def test_profile_default_fields_are_not_passed() -> None:
    kw = form.setup_kwargs(dict(DEFAULTS))
    for name in ("precision", "optimizer", "attn", "targets", "gradient_checkpointing"):
        assert name not in kw
    assert form.setup_kwargs({**DEFAULTS, "gradient_checkpointing": "off"})["gradient_checkpointing"] is False


def test_user_text_is_escaped() -> None:
    out = view(model="<img src=x onerror=alert(1)>")
    assert "<img" not in out["model_msg"] and "&lt;img" in out["model_msg"]


def test_pasted_config_is_used_instead_of_the_name() -> None:
    # Tiny Llama (tests/conftest.py): embed 1000x256, 4 layers of q,o 256x256 + k,v 256x64 (2 KV heads of 32)
    # + gate,up,down 256x688 + 2 norms, final norm, untied lm_head 256x1000.
    per_layer = 2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 688 + 2 * 256
    expected = 1000 * 256 + 4 * per_layer + 256 + 256 * 1000
    d = callbacks.estimate_dict({**DEFAULTS, "model": "", "config_text": json.dumps(TINY_LLAMA)})
    assert d["model"]["params_total"] == expected
    assert attr(view(model="", config_text=json.dumps(TINY_LLAMA))["verdict"], "data-verdict") == "FITS"


def test_unexpected_failure_is_one_line_and_the_next_call_works(monkeypatch) -> None:
    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(callbacks, "_estimate", boom)
    out = view()
    assert "internal error (RuntimeError: kaboom)" in out["setup_msg"]
    assert "Traceback" not in "".join(out.values())
    monkeypatch.undo()
    assert attr(view()["verdict"], "data-verdict") == "FITS"


def test_upload_reads_text_and_refuses_binary_and_huge(tmp_path) -> None:
    good = json.dumps(TINY_LLAMA).encode()
    assert callbacks.read_upload(good) == (json.dumps(TINY_LLAMA), "")
    text, msg = callbacks.read_upload(b"\xff\xfe\x00\x81" * 10)
    assert text == "" and "UTF-8" in msg
    assert "bytes" in callbacks.read_upload(b" " * (512 * 1024 + 1))[1]
    assert callbacks.read_upload(None) == ("", "")
    # A path string (what a client could name) is never opened: it is refused as "not a file".
    canary = tmp_path / "config.json"
    canary.write_text(json.dumps(TINY_LLAMA))
    text, msg = callbacks.read_upload(str(canary))
    assert text == "" and "did not arrive as a file" in msg


def test_whole_number_rules() -> None:
    assert form.whole("rank", 16.0) == 16
    assert form.whole("zero", "0", minimum=0) == 0
    for bad in (None, "", "x", 2.5, float("nan"), float("inf"), True, 0):
        with pytest.raises(ValueError):
            form.whole("batch", bad)


def test_gib_and_tick_steps() -> None:
    assert views.gib(RTX4090_BYTES) == "23.76"
    assert views.gib(None) == "-"
    # 1-2-5 steps, at most 6 ticks: 26 GiB -> 5 (6 ticks: 0..25), 130 GiB -> 50, 0.5 GiB -> 0.1
    assert views.tick_step(26) == 5 and views.tick_step(130) == 50
    assert views.tick_step(0.5) == pytest.approx(0.1)


def test_kernel_fields_reach_the_estimate() -> None:
    v = dict(form.DEFAULTS, method="lora", loss="fused", compile=True, activation_offload=False)
    kw = form.setup_kwargs(v)
    assert (kw["loss"], kw["compile"]) == ("fused", True)
    assert "activation_offload" not in kw  # unticked: the setup's own default
    assert "loss" not in form.setup_kwargs(dict(form.DEFAULTS))  # the profile chooses


def test_core_messages_name_the_page_fields_not_cli_flags() -> None:
    from tuneplan.errors import TuneplanError
    from tuneplan.web.wording import LABELS, page_error

    # the core refers to fields, each face words them: the page by the labels of its widgets
    with pytest.raises(TuneplanError) as caught:
        TrainSetup(method="lora", bits=8).validate()
    err = caught.value
    assert "--" not in err.message and "{method=qlora}" in err.accepted
    out = page_error(err)
    assert "--" not in out and "{" not in out
    assert out.startswith(f"{LABELS['bits']}: ") and f"“{LABELS['method']}” set to qlora" in out
    assert f"leave out “{LABELS['bits']}”" in out
    switch = TuneplanError("x", field="zero", accepted="{gradient_checkpointing=false}, {fsdp}")
    assert page_error(switch) == (f"{LABELS['zero']}: x; accepted: “{LABELS['gradient_checkpointing']}” off, "
                                  f"“{LABELS['fsdp']}”")
    # a key of a file is shown as the file spells it, even when a setup field has that name
    from tuneplan.errors import ConfigError

    assert page_error(ConfigError("`optimizer`: bad", field="optimizer")).startswith("optimizer: ")
    # the page shows them that way: an invalid combination from the core, rendered
    v = view(method="lora", zero="2", fsdp=True, gpus=2)
    shown = v["hardware_msg"]  # zero / fsdp sit in the hardware group
    assert "“FSDP full shard”" in shown and "“DeepSpeed ZeRO stage”" in shown
    assert "--zero" not in shown and "--fsdp" not in shown


def test_classifier_labels_field_reaches_the_core() -> None:
    # empty: the language-model head; a number: transformers' *ForSequenceClassification head, whose logits
    # are num_labels wide instead of vocabulary-wide (the same estimate as `tuneplan estimate --num-labels 2`)
    from tuneplan.api import estimate

    kw = form.setup_kwargs({**DEFAULTS, "method": "lora", "num_labels": "2"})
    assert kw["num_labels"] == 2 and "num_labels" not in form.setup_kwargs({**DEFAULTS, "method": "lora"})
    lm, clf = view(method="lora"), view(method="lora", num_labels="2")
    assert segments(clf["chart"]) != segments(lm["chart"])
    core = estimate(DEFAULTS["model"], gpu=DEFAULTS["gpu"], **kw).breakdown.allocated_peak_bytes
    assert segments(clf["chart"]) and sum(segments(clf["chart"]).values()) >= core
    bad = view(method="lora", num_labels="two")
    assert "Classifier labels" in bad["setup_msg"] and "not a number" in bad["setup_msg"]
