"""The grid (numpy over every batch x seq at once) against the scalar estimate, setup by setup.

A seeded walk over models, methods, frameworks, precisions, optimizers, checkpointing, attention, losses and
parallelism draws 400 resolved setups; each is evaluated as one grid over 5 batch sizes x 5 sequence lengths
(10,000 configurations) and, configuration by configuration, through the scalar path. Every figure must
agree to 1e-9 relative (the two paths run the same formulas in the same float64 order, so they agree
exactly); the peak instant and the fit verdict must be the same.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import tuneplan
from tuneplan.api import build_setup
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError
from tuneplan.estimator.memory import memory_of
from tuneplan.grid import COMPONENT_ORDER, estimate_grid, memory_plane

MODELS = ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-2-7b-hf", "google/gemma-2b",
          "mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen3-30B-A3B", "microsoft/Phi-3-mini-4k-instruct",
          "openai-community/gpt2", "microsoft/phi-2", "EleutherAI/pythia-6.9b",
          "google-bert/bert-large-uncased", "deepseek-ai/DeepSeek-V2-Lite"]


def _draw(rng: random.Random) -> dict:
    kw: dict = {"method": rng.choice(["full", "freeze", "lora", "qlora"]),
                "framework": rng.choice(["hf", "llamafactory", "unsloth", "torchtune", "torchtune-0.2",
                                         "litgpt"]),
                "gradient_checkpointing": rng.random() < 0.5,
                "precision": rng.choice(["fp32", "fp16-mixed", "bf16-mixed", "fp16", "bf16"]),
                "grad_accum": rng.choice([1, 1, 2, 8])}
    if rng.random() < 0.5:
        kw["attn"] = rng.choice(["eager", "sdpa", "flash"])
    if kw["method"] in ("lora", "qlora"):
        kw["rank"] = rng.choice([1, 8, 16, 64, 256])
        kw["targets"] = rng.choice(["all-linear", "attn", "mlp", None])
    if rng.random() < 0.4:
        kw["optimizer"] = rng.choice(["adamw", "adamw-fused", "adamw-hf", "adamw-8bit", "paged-adamw-8bit",
                                      "adafactor", "sgd"])
    r = rng.random()
    if r < 0.15:
        kw.update(gpus=rng.choice([2, 8]), zero=rng.choice([1, 2, 3]))
    elif r < 0.25:
        kw.update(gpus=rng.choice([2, 8]), fsdp=True)
    elif r < 0.3:
        kw.update(gpus=4)
    for flag, p in (("longest_batch_first", 0.1), ("activation_offload", 0.1), ("compile", 0.1),
                    ("keep_grads", 0.05), ("softmax_keeps_input", 0.05), ("optimizer_in_backward", 0.05)):
        if rng.random() < p:
            kw[flag] = True
    if rng.random() < 0.15:
        kw["loss"] = rng.choice(["upcast", "chunked", "fused", "fused-linear"])
    if rng.random() < 0.05:
        kw["num_labels"] = rng.choice([1, 2])
    return {k: v for k, v in kw.items() if v is not None}


def _close(a: int, b: int) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1)


def test_grid_agrees_with_the_scalar_estimate_on_10000_setups():
    rng = random.Random(17)
    specs = {m: resolve_model(m) for m in MODELS}
    gpus = [None, resolve_accelerator("rtx4090"), resolve_accelerator("a100-80gb")]
    checked = full_api = 0
    while checked < 10_000:
        name, kw, acc = rng.choice(MODELS), _draw(rng), rng.choice(gpus)
        spec = specs[name]
        try:
            setup = build_setup(spec, accelerator=acc, **kw)
            run = tuneplan.api.resolve_run(spec, setup)
        except TuneplanError:
            continue  # an invalid combination (e.g. a target the model lacks): nothing to compare
        batches = sorted(rng.sample(range(1, 65), 5))
        seqs = sorted(rng.sample(range(16, 16385), 5))
        plane = memory_plane(run, np.asarray(batches)[:, None], np.asarray(seqs)[None, :])
        errors = any(f.level == "error" for f in run.findings(acc))
        for i, b in enumerate(batches):
            for j, s in enumerate(seqs):
                one = memory_of(run.reshaped(batch=b, seq=s))
                assert _close(one.allocated_peak_bytes, int(plane["allocated"][i, j])), (name, kw, b, s)
                assert _close(one.reserved_peak_bytes, int(plane["reserved"][i, j])), (name, kw, b, s)
                assert _close(one.device_peak_bytes, int(plane["device_peak"][i, j])), (name, kw, b, s)
                assert one.peak_instant == plane["peak_instant"][i, j], (name, kw, b, s)
                for c in COMPONENT_ORDER:
                    assert _close(one.components[c], int(plane[f"c:{c}"][i, j])), (name, kw, b, s, c)
                if acc is not None:
                    fits = not errors and one.device_peak_bytes <= acc.memory_bytes
                    assert fits == bool(not errors and plane["device_peak"][i, j] <= acc.memory_bytes)
                checked += 1
        # the public path end to end, once per drawn setup (resolution from scratch, no shared Run)
        b, s = batches[-1], seqs[0]
        est = tuneplan.estimate(spec, gpu=acc, timing=False, **{**kw, "batch": b, "seq": s})
        assert est.breakdown.allocated_peak_bytes == int(plane["allocated"][-1, 0])
        assert est.breakdown.device_peak_bytes == int(plane["device_peak"][-1, 0])
        full_api += 1
    assert full_api >= 100


def test_estimate_grid_shape_follows_the_axes_in_order():
    g = estimate_grid("qwen2.5-0.5b", gpu="rtx4090", method="lora", rank=[8, 16, 32], seq=[256, 512],
                      batch=[1, 2, 4, 8])
    assert g.shape == (3, 2, 4)
    assert list(g.axes) == ["rank", "seq", "batch"]
    e = tuneplan.estimate("qwen2.5-0.5b", gpu="rtx4090", method="lora", rank=32, seq=256, batch=8,
                          timing=False)
    assert int(g.device_peak[2, 0, 3]) == e.breakdown.device_peak_bytes
    assert bool(g.fits[2, 0, 3]) == e.fits
    assert int(g.components["activations"][2, 0, 3]) == e.breakdown.components["activations"]
    # memory grows with the micro-batch at a fixed rank and length
    assert (np.diff(g.allocated, axis=2) > 0).all()


def test_estimate_grid_single_values_and_bad_axes():
    g = estimate_grid("qwen2.5-0.5b", method="full", seq=[128, 256])
    assert g.shape == (2,) and g.fits is None
    with pytest.raises(TuneplanError) as e:
        estimate_grid("qwen2.5-0.5b", batch=[1, 0])
    assert e.value.field == "batch"
    with pytest.raises(TuneplanError):
        estimate_grid("qwen2.5-0.5b", seq=[])


def test_invalid_combinations_are_marked_not_raised():
    # ZeRO needs at least 2 GPUs: the (gpus=1, zero=2) cells are not valid setups; the others are computed
    g = estimate_grid("qwen2.5-0.5b", gpu="rtx4090", method="full", gpus=[1, 2], zero=[0, 2], seq=[256, 512])
    assert g.shape == (2, 2, 2)
    assert g.valid.tolist() == [[[True, True], [False, False]], [[True, True], [True, True]]]
    assert not g.fits[0, 1].any() and (g.allocated[0, 1] == 0).all()
    assert "zero" in g.invalid[(1, 2)]
    e = tuneplan.estimate("qwen2.5-0.5b", gpu="rtx4090", method="full", gpus=2, zero=2, seq=512, timing=False)
    assert int(g.device_peak[1, 1, 1]) == e.breakdown.device_peak_bytes
    with pytest.raises(TuneplanError):  # no valid combination at all: the input itself is wrong
        estimate_grid("qwen2.5-0.5b", method="full", gpus=1, zero=[2, 3])
