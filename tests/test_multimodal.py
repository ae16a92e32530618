"""A multimodal config is refused ("vision part not modelled"), never counted as its language model alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuneplan.errors import ConfigError
from tuneplan.specs.model import model_from_config


def default_config(model_type: str) -> dict[str, Any]:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    written = transformers.AutoConfig.for_model(model_type).to_dict()
    out: dict[str, Any] = json.loads(json.dumps(written, default=str))
    return out


@pytest.mark.parametrize("model_type", ["llava", "blip-2", "idefics2", "gemma3", "qwen2_vl", "mllama"])
def test_transformers_multimodal_configs_are_refused(model_type: str) -> None:
    with pytest.raises(ConfigError) as exc:
        model_from_config(default_config(model_type), "m")
    assert "vision part not modelled" in exc.value.message and exc.value.field == "m.vision_config"


def test_a_tower_named_by_path_is_refused() -> None:
    """LLaVA-1.5 as first published: a Llama config with the CLIP tower named in mm_vision_tower."""
    cfg = {"model_type": "llava_llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
           "intermediate_size": 64, "vocab_size": 100, "mm_vision_tower": "openai/clip-vit-large-patch14-336"}
    with pytest.raises(ConfigError, match="vision part not modelled"):
        model_from_config(cfg, "m")


def test_language_part_alone_and_text_wrappers_still_read() -> None:
    """The language model's own config (text_config as a file, or a wrapper holding only that) is planned."""
    text = default_config("gemma3")["text_config"]
    wrapped = model_from_config({"model_type": "gemma3", "text_config": text}, "m")
    assert model_from_config(text, "m").params_total == wrapped.params_total


def test_cli_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(default_config("llava")))
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", str(cfg), "--gpu", "rtx4090"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "vision part not modelled" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("model_type", "key"), [("granite_speech", "encoder_config"),
                                                 ("grounding-dino", "backbone_config")])
def test_a_second_stack_beside_the_text_model_is_refused(model_type: str, key: str) -> None:
    """A speech encoder or a detection backbone beside text_config: counted alone, the text model was 3.6 %
    (Granite Speech) and 36 % (Grounding DINO) under transformers' count."""
    with pytest.raises(ConfigError) as exc:
        model_from_config(default_config(model_type), "m")
    assert "part not modelled" in exc.value.message and exc.value.field == f"m.{key}"
