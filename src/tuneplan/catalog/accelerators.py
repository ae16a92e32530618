"""The accelerator catalog shipped with the package, and loose name resolution.

``resolve_accelerator("4090")``, ``"RTX 4090"``, ``"a100-80g"``, ``"a100 80gb sxm"``, ``"910b"`` all
resolve; a miss raises UnknownNameError with the nearest names.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from importlib import resources

from tuneplan.errors import UnknownNameError
from tuneplan.specs.hardware import Accelerator

# Short names people type -> catalog id (the SXM / most common variant for bare names).
ALIASES = {
    "4090": "rtx-4090", "3090": "rtx-3090", "5090": "rtx-5090", "4080": "rtx-4080", "3080": "rtx-3080-10gb",
    "3060": "rtx-3060-12gb", "2080ti": "rtx-2080-ti", "4060ti": "rtx-4060-ti-16gb", "5080": "rtx-5080",
    "4090d": "rtx-4090-d", "3090ti": "rtx-3090-ti", "4070tisuper": "rtx-4070-ti-super",
    "a100": "a100-80gb-sxm4", "a10080g": "a100-80gb-sxm4", "a10080gb": "a100-80gb-sxm4",
    "a10040g": "a100-40gb-sxm4", "a10040gb": "a100-40gb-sxm4", "a100sxm": "a100-80gb-sxm4",
    "a10080gbsxm": "a100-80gb-sxm4", "a10080gsxm": "a100-80gb-sxm4", "a10080gbpcie": "a100-80gb-pcie",
    "a10040gbsxm": "a100-40gb-sxm4", "a10040gbpcie": "a100-40gb-pcie",
    "a800": "a800-80gb-sxm4", "h100": "h100-sxm5-80gb", "h100sxm": "h100-sxm5-80gb", "h100pcie": "h100-pcie-80gb",
    "h100nvl": "h100-nvl-94gb", "h800": "h800-sxm5-80gb", "h200": "h200-sxm-141gb", "h20": "h20-96gb",
    "gh200": "gh200-grace-hopper", "b200": "b200",
    "v100": "v100-sxm2-32gb", "v10032g": "v100-sxm2-32gb", "v10032gb": "v100-sxm2-32gb",
    "v10016g": "v100-sxm2-16gb", "v10016gb": "v100-sxm2-16gb",
    "p100": "p100-pcie-16gb", "p40": "p40", "t4": "t4", "a10": "a10", "a10g": "a10g", "l4": "l4",
    "l40s": "l40s", "l40": "l40", "l20": "l20", "a40": "a40", "a30": "a30", "a6000": "rtx-a6000",
    "rtxa6000": "rtx-a6000", "a5000": "rtx-a5000", "a4000": "rtx-a4000", "5880": "rtx-5880-ada-generation",
    "rtx5880": "rtx-5880-ada-generation", "rtx5880ada": "rtx-5880-ada-generation",
    "6000ada": "rtx-6000-ada-generation", "rtx6000ada": "rtx-6000-ada-generation",
    "rtxpro6000": "rtx-pro-6000-blackwell-workstation-edition",
    "910b": "ascend-910b", "ascend910b": "ascend-910b", "910b4": "ascend-910b4", "ascend910b4": "ascend-910b4",
    "mi300x": "mi300x", "mi300": "mi300x", "mi250x": "mi250x", "mi250": "mi250x", "mi210": "mi210",
    "mi325x": "mi325x",
}


def _key(name: str) -> str:
    s = name.lower()
    for w in ("nvidia", "geforce", "tesla", "instinct", "amd", "huawei", "generation", "edition"):
        s = s.replace(w, "")
    s = re.sub(r"[^a-z0-9]", "", s)
    s = s.replace("gb", "g") if re.search(r"\d+gb", s) else s
    return s


def _tokens(name: str) -> frozenset[str]:
    s = name.lower()
    for w in ("nvidia", "geforce", "tesla", "instinct", "amd", "huawei"):
        s = s.replace(w, " ")
    toks = re.findall(r"[a-z]+|\d+", s)
    return frozenset("gb" if t == "g" else t for t in toks)


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Accelerator]:
    text = resources.files("tuneplan.catalog").joinpath("accelerators.json").read_text(encoding="utf-8")
    return {d["id"]: Accelerator.from_dict(d) for d in json.loads(text)}


def accelerators(extra: dict[str, Accelerator] | None = None) -> dict[str, Accelerator]:
    cat = dict(_catalog())
    if extra:
        cat.update(extra)
    return cat


def _index(cat: dict[str, Accelerator]) -> dict[str, str]:
    idx: dict[str, str] = {}
    for acc_id, acc in cat.items():
        for n in (acc_id, acc.name, *acc.aliases):
            idx.setdefault(_key(n), acc_id)
    for alias, acc_id in ALIASES.items():
        if acc_id in cat:
            idx.setdefault(_key(alias), acc_id)
            idx.setdefault(alias, acc_id)
    return idx


def resolve_accelerator(name: str, extra: dict[str, Accelerator] | None = None) -> Accelerator:
    cat = accelerators(extra)
    if name in cat:
        return cat[name]
    idx = _index(cat)
    k = _key(name)
    for cand in (k, k.replace("rtx", ""), k.replace("g", "gb")):
        if cand in idx:
            return cat[idx[cand]]
    # Same tokens in another order ("A100-SXM4-40GB" = "a100-40gb-sxm4")
    toks = _tokens(name)
    if toks:
        same = sorted({acc_id for acc_id, acc in cat.items()
                       if any(toks <= _tokens(n) for n in (acc_id, acc.name, *acc.aliases))})
        if len(same) == 1:
            return cat[same[0]]
    # Unique prefix or containment ("a100 80gb sxm" -> a10080gsxm4)
    hits = sorted({v for kk, v in idx.items() if kk.startswith(k) or (len(k) >= 3 and k in kk)})
    if len(hits) == 1:
        return cat[hits[0]]
    close = difflib.get_close_matches(k, list(idx), n=5, cutoff=0.5)
    sugg = list(dict.fromkeys([idx[c] for c in close] + hits))[:6]
    raise UnknownNameError(f"unknown accelerator {name!r}", field="gpu", suggestions=sugg,
                           accepted="a catalog id (see `tuneplan gpus --list`) or --hardware-file")
