"""Loose card names -> the card they mean, over a mapping of cards by id.

``"4090"``, ``"RTX 4090"``, ``"a100-80g"``, ``"a100 80gb sxm"``, ``"910b"``, ``"NVIDIA H100 80GB HBM3"``
(what NVML reports) all resolve; a miss raises UnknownNameError with the nearest names.

One rule for a name that could mean several cards of one model (the same card model in other memory
sizes or boards, e.g. the four V100s): when they differ in memory the name is refused with the variants
listed (a memory verdict on a guessed size is the costly wrong answer: "FITS" on a 32 GB card the user
does not have); when they share the memory and differ only in the board (A100 80GB SXM4 / PCIe) the
name means the SXM/HGX board, and the faces print that choice beside the card (docs/usage.md, "Card
names").
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from typing import Any

from tuneplan.errors import UnknownNameError
from tuneplan.specs.hardware import Accelerator

# Short names people type, and the names nvidia-smi / NVML / npu-smi print -> catalog id.
# A short name that leaves the memory open (v100, a100) is refused by check_variants, alias or not;
# one that fixes the memory maps to the SXM (HGX) board.
ALIASES = {
    "4090": "rtx-4090", "3090": "rtx-3090", "5090": "rtx-5090", "4080": "rtx-4080",
    "3080": "rtx-3080-10gb", "3060": "rtx-3060-12gb", "2080ti": "rtx-2080-ti", "5080": "rtx-5080",
    "4060": "rtx-4060", "3060ti": "rtx-3060-ti", "5070": "rtx-5070", "5070ti": "rtx-5070-ti",
    "4090d": "rtx-4090-d", "3090ti": "rtx-3090-ti", "4070tisuper": "rtx-4070-ti-super",
    "a100": "a100-80gb-sxm4", "a10080g": "a100-80gb-sxm4", "a10080gb": "a100-80gb-sxm4",
    "a10040g": "a100-40gb-sxm4", "a10040gb": "a100-40gb-sxm4", "a100sxm": "a100-80gb-sxm4",
    "a10080gbsxm": "a100-80gb-sxm4", "a10080gsxm": "a100-80gb-sxm4", "a10080gbpcie": "a100-80gb-pcie",
    "a10040gbsxm": "a100-40gb-sxm4", "a10040gbpcie": "a100-40gb-pcie", "a100pcie": "a100-80gb-pcie",
    "a800": "a800-80gb-sxm4", "h100": "h100-sxm5-80gb", "h100sxm": "h100-sxm5-80gb",
    "h100pcie": "h100-pcie-80gb", "h100nvl": "h100-nvl-94gb", "h800": "h800-sxm5-80gb",
    "h200": "h200-sxm-141gb", "h20": "h20-96gb", "gh200": "gh200-grace-hopper", "b200": "b200",
    "v100": "v100-sxm2-32gb", "v10032g": "v100-sxm2-32gb", "v10032gb": "v100-sxm2-32gb",
    "v10016g": "v100-sxm2-16gb", "v10016gb": "v100-sxm2-16gb", "v100pcie": "v100-pcie-32gb",
    "p100": "p100-pcie-16gb", "p40": "p40", "t4": "t4", "a10": "a10", "a10g": "a10g", "l4": "l4",
    "l40s": "l40s", "l40": "l40", "l20": "l20", "a40": "a40", "a30": "a30", "a16": "a16",
    "a6000": "rtx-a6000", "rtxa6000": "rtx-a6000", "a5000": "rtx-a5000", "a4000": "rtx-a4000",
    "5880": "rtx-5880-ada-generation", "rtx5880": "rtx-5880-ada-generation",
    "rtx5880ada": "rtx-5880-ada-generation",
    "6000ada": "rtx-6000-ada-generation", "rtx6000ada": "rtx-6000-ada-generation",
    "rtxpro6000": "rtx-pro-6000-blackwell-workstation-edition",
    "910b": "ascend-910b", "ascend910b": "ascend-910b", "910b4": "ascend-910b4",
    "ascend910b4": "ascend-910b4",
    "mi300x": "mi300x", "mi300": "mi300x", "mi250x": "mi250x", "mi250": "mi250x", "mi210": "mi210",
    "mi325x": "mi325x",
    # npu-smi prints the SKU: 910B1/910B2/910B2C/910B3 are the 64 GB part (gpus.csv row name)
    "910b1": "ascend-910b", "910b2": "ascend-910b", "910b2c": "ascend-910b", "910b3": "ascend-910b",
    # NVML / nvidia-smi names (memory type tells H100 SXM5 = HBM3 from PCIe = HBM2e)
    "H100 80GB HBM3": "h100-sxm5-80gb", "H100 SXM5 80GB": "h100-sxm5-80gb", "H100 PCIe": "h100-pcie-80gb",
    "A100-SXM4-80GB": "a100-80gb-sxm4", "A100-SXM4-40GB": "a100-40gb-sxm4",
    "A100-PCIE-40GB": "a100-40gb-pcie", "A100 80GB PCIe": "a100-80gb-pcie",
    "A800-SXM4-80GB": "a800-80gb-sxm4", "H800": "h800-sxm5-80gb",
    "H200": "h200-sxm-141gb", "H20": "h20-96gb", "GH200 480GB": "gh200-grace-hopper",
    "V100-SXM2-32GB": "v100-sxm2-32gb", "V100-SXM2-16GB": "v100-sxm2-16gb",
    "V100-PCIE-32GB": "v100-pcie-32gb", "V100-PCIE-16GB": "v100-pcie-16gb",
    "P100-PCIE-16GB": "p100-pcie-16gb",
}

# Words that make a different card of the same number (RTX 4060 vs 4060 Ti, 4070 Ti vs Ti Super, 4090 vs
# 4090 D, L40 vs L40S, MI300 vs MI300X, H100 vs H100 NVL): a loose match may add memory sizes and form
# factors to what was typed, never one of these.
VARIANT_WORDS = frozenset({"ti", "super", "d", "s", "x", "xt", "nvl", "max", "c"})
_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "instinct", "amd", "huawei")


# pure functions of the text, kept for the catalog's names every lookup compares again (bounded: the web
# page's typed names pass through them too)
@lru_cache(maxsize=4096)
def name_key(name: str) -> str:
    """The name as the index compares it: lower case, no vendor words or punctuation, ``80gb`` -> ``80g``."""
    s = name.lower()
    for w in (*_VENDOR_WORDS, "generation", "edition"):
        s = s.replace(w, "")
    s = re.sub(r"[^a-z0-9]", "", s)
    s = s.replace("gb", "g") if re.search(r"\d+gb", s) else s
    return s


@lru_cache(maxsize=4096)
def _tokens(name: str) -> frozenset[str]:
    s = name.lower()
    for w in _VENDOR_WORDS:
        s = s.replace(w, " ")
    toks = re.findall(r"[a-z]+|\d+", s)
    return frozenset("gb" if t == "g" else t for t in toks)


@lru_cache(maxsize=4096)
def _bare_model(name: str) -> str:
    """'H100 80GB' -> 'h100': the model name without memory size, form factor or vendor."""
    s = re.sub(r"\d+\s*gb?\b", " ", name.lower())
    s = re.sub(r"\b(sxm\d?|pcie|hbm\d?e?)\b", " ", s)
    return name_key(s)


# _index's last answer: (the card ids and the identities of the card objects it was made from, those
# objects, the index). The objects are kept, so no other object takes one of their identities while they
# are; the same cards (the shipped catalog's objects, made once) give the same index: a GPU named loosely
# on every estimate builds it once (about 100 us of a 460 us estimate from the names).
_last_index: list[Any] = []


def _index(cat: dict[str, Accelerator]) -> dict[str, str]:
    """Every card's id, name and aliases (then the catalog's ALIASES) by ``name_key``: the first card to
    claim a key keeps it. Read only by its callers (the last one made is shared)."""
    key = (tuple(cat), tuple(map(id, cat.values())))
    if _last_index and _last_index[0] == key:
        kept: dict[str, str] = _last_index[2]
        return kept
    idx: dict[str, str] = {}
    # user aliases and ids first: a user's card named like a catalog alias wins
    for acc_id, acc in cat.items():
        for n in (acc_id, acc.name, *acc.aliases):
            idx.setdefault(name_key(n), acc_id)
    for alias, acc_id in ALIASES.items():
        if acc_id in cat:
            idx.setdefault(name_key(alias), acc_id)
    _last_index[:] = [key, list(cat.values()), idx]
    return idx


def _prefer(name: str, candidates: list[str], cat: dict[str, Accelerator]) -> str | None:
    """Several cards match: the bare model's default variant, else the only SXM card among them."""
    default = ALIASES.get(_bare_model(name))
    if default in candidates:
        return default
    sxm = [c for c in candidates if "sxm" in c or "sxm" in (cat[c].form_factor or "").lower()]
    return sxm[0] if len(sxm) == 1 else None


def _same_model(toks: frozenset[str], acc_id: str, cat: dict[str, Accelerator]) -> bool:
    """The card adds no variant word to what was typed (in its id or any of its names)."""
    acc = cat[acc_id]
    return any(not ((_tokens(n) - toks) & VARIANT_WORDS) for n in (acc_id, acc.name, *acc.aliases))


def _ambiguous(name: str, ids: list[str]) -> UnknownNameError:
    return UnknownNameError(f"{name!r} matches several cards: {', '.join(ids)}", field="gpu",
                            suggestions=ids, accepted="one of these ids (see `tuneplan accelerators`)")


def _one_of(name: str, same: list[str], cat: dict[str, Accelerator]) -> Accelerator | None:
    """The one match, or the documented default among several (``_prefer``); several without one:
    an error."""
    if len(same) == 1:
        return cat[same[0]]
    if same:
        if pick := _prefer(name, same, cat):
            return cat[pick]
        raise _ambiguous(name, same)
    return None


def resolve_in(name: str, cat: dict[str, Accelerator]) -> Accelerator:
    """The card ``name`` means (:func:`match_card`), refused when its variants differ in memory."""
    acc = match_card(name, cat)
    check_variants(name, acc, variants_of(name, acc, cat))
    return acc


def _family(acc_id: str) -> str:
    """The card model of a catalog id without memory size and board: 'v100-sxm2-16gb' -> 'v100'."""
    return _bare_model(acc_id)


def variants_of(name: str, acc: Accelerator, cat: dict[str, Accelerator]) -> list[Accelerator]:
    """The other cards of ``acc``'s model that ``name`` does not tell apart from it: same family id, and
    every word typed is among the words of one of their names (``v100-32gb`` leaves the V100 PCIe 32GB
    open, ``v100-sxm2-32gb`` does not). Exact ids and a card's full name mean that card only."""
    if name in cat or name.strip().lower() in (acc.id, acc.name.lower()):
        return []
    fam, toks = _family(acc.id), _tokens(name)
    return [c for i, c in cat.items() if i != acc.id and _family(i) == fam
            and any(toks <= _tokens(n) for n in (i, c.name, *c.aliases))]


def _memory_size(acc: Accelerator) -> float:
    """The memory size a card is sold by (boards of one size report a few MiB apart: not a variant)."""
    return acc.memory_gb_marketed or acc.memory_bytes / 1e9


def memory_families(cat: dict[str, Accelerator]) -> dict[str, list[str]]:
    """The card models ``cat`` holds in several memory sizes (a bare name is refused), with their card
    ids: ``{"v100": ["v100-pcie-16gb", ...], "a100": [...]}``."""
    by_family: dict[str, list[Accelerator]] = {}
    for acc in cat.values():
        by_family.setdefault(_family(acc.id), []).append(acc)
    return {fam: sorted(a.id for a in cards) for fam, cards in sorted(by_family.items())
            if len({_memory_size(a) for a in cards}) > 1}


def check_variants(name: str, acc: Accelerator, others: list[Accelerator]) -> None:
    """Refuse ``name`` when ``acc`` and the ``others`` it leaves open differ in memory."""
    if any(_memory_size(o) != _memory_size(acc) for o in others):
        cards = sorted([acc, *others], key=lambda a: (_memory_size(a), a.id))
        sizes = " or ".join(dict.fromkeys(f"{_memory_size(a):g} GB" for a in cards))
        raise UnknownNameError(f"{name!r} names {len(cards)} cards with {sizes} of memory, and the verdict "
                               "depends on which", field="gpu", suggestions=[a.id for a in cards],
                               accepted="the card's id")


def resolve_named_in(name: str, cat: dict[str, Accelerator]) -> tuple[Accelerator, str | None]:
    """:func:`resolve_in` and the choice a face prints beside the card when ``name`` also names other
    boards of the same memory ("a100-80gb read as a100-80gb-sxm4, not a100-80gb-pcie"), else None."""
    acc = match_card(name, cat)
    others = variants_of(name, acc, cat)
    check_variants(name, acc, others)
    if not others:
        return acc, None
    return acc, f"{name.strip()} read as {acc.id}, not {', '.join(sorted(o.id for o in others))}"



def match_card(name: str, cat: dict[str, Accelerator]) -> Accelerator:
    """Exact id, name or alias first; then loose matches of the same card model (never a variant: see
    VARIANT_WORDS). Several matches without a documented default are an error listing them."""
    if name in cat:
        return cat[name]
    idx = _index(cat)
    k = name_key(name)
    for cand in (k, k.replace("rtx", ""), k.replace("g", "gb")):
        if cand in idx:
            return cat[idx[cand]]
    toks = _tokens(name)
    # Same tokens in another order ("A100-SXM4-40GB" = "a100-40gb-sxm4")
    loose: list[str] = []
    if toks:
        loose = sorted({acc_id for acc_id, acc in cat.items()
                        if any(toks <= _tokens(n) for n in (acc_id, acc.name, *acc.aliases))})
        if found := _one_of(name, [i for i in loose if _same_model(toks, i, cat)], cat):
            return found
    # Unique prefix or containment ("a100 80gb sxm" -> a10080gsxm4), of the same card model
    hits = sorted({v for kk, v in idx.items() if kk.startswith(k) or (len(k) >= 3 and k in kk)})
    if found := _one_of(name, [i for i in hits if not toks or _same_model(toks, i, cat)], cat):
        return found
    close = difflib.get_close_matches(k, list(idx), n=5, cutoff=0.5)
    sugg = list(dict.fromkeys(hits + loose + [idx[c] for c in close]))[:8]
    raise UnknownNameError(f"unknown accelerator {name!r}", field="gpu", suggestions=sugg,
                           accepted="a catalog id (see `tuneplan accelerators`), "
                           "or add it with {hardware_file}")

