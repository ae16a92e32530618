"""Read the training configs people already have (LLaMA-Factory, axolotl, TrainingArguments, PEFT,
bitsandbytes, DeepSpeed, accelerate) into TrainSetup fields, each with the ``file:line`` it came from.

    >>> from tuneplan.ingest import read_configs
    >>> r = read_configs(["examples/qwen2.5-7b-qlora.yaml"], {"gpus": 1})
    >>> r.model, r.setup_kw["method"], r.sources["method"]

Pure reading: no estimate, no printing. Readers never import the training libraries.
"""

from tuneplan.ingest.common import Ingested
from tuneplan.ingest.merge import Resolved, merge_from_files, read_configs
from tuneplan.ingest.read import KINDS, detect_kind, read_config

__all__ = ["KINDS", "Ingested", "Resolved", "detect_kind", "merge_from_files", "read_config", "read_configs"]
