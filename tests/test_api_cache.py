"""``tuneplan.estimate`` keeps resolved runs: a repeated call with other sizes reuses them, and gives exactly
what resolving from scratch gives; anything else the resolve reads (model file, hardware files, fields)
makes a new entry."""

from __future__ import annotations

import json
import os
import time

import pytest

from tuneplan import api
from tuneplan.api import build_setup, estimate, estimate_run, resolve_run
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.errors import TuneplanError


def fresh(model, gpu, **kw):
    """The estimate resolved from scratch, without the cache (the path estimate() took before it)."""
    spec = resolve_model(model) if isinstance(model, str) else model
    acc = resolve_accelerator(gpu) if isinstance(gpu, str) else gpu
    return estimate_run(resolve_run(spec, build_setup(spec, None, accelerator=acc, **kw)), gpu=acc)


@pytest.mark.parametrize("base", [
    {"method": "lora", "rank": 16},
    {"method": "qlora", "bits": 4, "rank": 64, "gradient_checkpointing": True},
    {"method": "full", "zero": 3, "gpus": 4},
    {"method": "full", "zero": 2, "offload": "optimizer"},
])
def test_repeated_calls_at_other_sizes_give_what_a_fresh_resolve_gives(base) -> None:
    api._RESOLVED.clear()
    spec = resolve_model("Qwen/Qwen2.5-0.5B")
    for model in ("Qwen/Qwen2.5-0.5B", spec):
        for shape in ({"batch": 1, "seq": 512}, {"batch": 4, "seq": 512}, {"batch": 2, "seq": 2048},
                      {"batch": 2, "seq": 2048, "grad_accum": 4}, {"batch": 1, "seq": 512}):
            got = estimate(model, gpu="rtx4090", **base, **shape).to_dict()
            assert got == fresh(model, "rtx4090", **base, **shape).to_dict(), shape
    # one entry per (model argument, fields but the sizes, which sizes were given)
    assert len(api._RESOLVED) == 4


def test_a_bad_size_is_refused_on_the_cached_path_as_on_a_fresh_one() -> None:
    estimate("Qwen/Qwen2.5-0.5B", gpu="rtx4090", method="lora", batch=1)
    for bad in (0, -3, 10**9, "4", 2.5):
        with pytest.raises(TuneplanError) as e:
            estimate("Qwen/Qwen2.5-0.5B", gpu="rtx4090", method="lora", batch=bad)
        assert e.value.field == "batch"


def test_the_key_covers_the_fields_the_model_file_and_the_hardware_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEPLAN_CONFIG_DIR", str(tmp_path / "conf"))
    a = estimate("Qwen/Qwen2.5-0.5B", gpu="rtx4090", method="lora", rank=8, batch=2)
    b = estimate("Qwen/Qwen2.5-0.5B", gpu="rtx4090", method="lora", rank=32, batch=2)
    assert a.setup.rank == 8 and b.setup.rank == 32  # another field: another entry
    # a model given as a path: editing its config.json is seen
    from tuneplan.catalog.models import _load_entry_config, _lookup

    cfg = dict(_load_entry_config(_lookup()["qwen/qwen2.5-0.5b"].file))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    one = estimate(str(path), gpu="rtx4090", method="lora", batch=1)
    cfg["num_hidden_layers"] = cfg["num_hidden_layers"] // 2
    path.write_text(json.dumps(cfg))
    later = time.time() + 5  # a newer modification time than the first write, whatever the clock's step
    os.utime(path, (later, later))
    two = estimate(str(path), gpu="rtx4090", method="lora", batch=2)
    assert two.model.n_layers == one.model.n_layers // 2
    # the user's hardware file: a card overridden after the first call is seen
    before = estimate("Qwen/Qwen2.5-0.5B", gpu="rtx4090", method="lora", batch=1)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "hardware.yaml").write_text("accelerators:\n  rtx-4090:\n    memory_gib: 20\n")
    after = estimate("Qwen/Qwen2.5-0.5B", gpu="rtx4090", method="lora", batch=2)
    assert before.gpu is not None and after.gpu is not None
    assert after.gpu.memory_bytes == 20 * 2**30 != before.gpu.memory_bytes
