"""The accelerator catalog shipped with the package, user additions, and loose name resolution.

``resolve_accelerator("4090")``, ``"RTX 4090"``, ``"a100-80g"``, ``"a100 80gb sxm"``, ``"910b"``,
``"NVIDIA H100 80GB HBM3"`` (what NVML reports) all resolve; a miss raises UnknownNameError with the
nearest names.

One rule for a name that could mean several cards of one model (the same card model in other memory
sizes or boards, e.g. the four V100s): when they differ in memory the name is refused with the variants
listed (a memory verdict on a guessed size is the costly wrong answer: "FITS" on a 32 GB card the user
does not have); when they share the memory and differ only in the board (A100 80GB SXM4 / PCIe) the
name means the SXM/HGX board and :func:`name_choice` says so, for the faces to print beside the card
(docs/usage.md, "Card names").

Users add or override cards in a TOML/YAML file (``--hardware-file``, or ``hardware.toml|yaml`` in
``$TUNEPLAN_CONFIG_DIR``, else ``~/.config/tuneplan/``); see :func:`load_hardware_file`.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from dataclasses import fields, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from tuneplan.errors import TuneplanError, UnknownNameError
from tuneplan.specs.hardware import Accelerator, parse_cc
from tuneplan.specs.limits import MAX_HARDWARE_NUMBER, show_value

# Short names people type, and the names nvidia-smi / NVML / npu-smi print -> catalog id.
# A short name that leaves the memory open (v100, a100) is refused by _check_variants, alias or not;
# one that fixes the memory maps to the SXM (HGX) board.
ALIASES = {
    "4090": "rtx-4090", "3090": "rtx-3090", "5090": "rtx-5090", "4080": "rtx-4080", "3080": "rtx-3080-10gb",
    "3060": "rtx-3060-12gb", "2080ti": "rtx-2080-ti", "5080": "rtx-5080", "4060": "rtx-4060", "3060ti": "rtx-3060-ti",
    "5070": "rtx-5070", "5070ti": "rtx-5070-ti",
    "4090d": "rtx-4090-d", "3090ti": "rtx-3090-ti", "4070tisuper": "rtx-4070-ti-super",
    "a100": "a100-80gb-sxm4", "a10080g": "a100-80gb-sxm4", "a10080gb": "a100-80gb-sxm4",
    "a10040g": "a100-40gb-sxm4", "a10040gb": "a100-40gb-sxm4", "a100sxm": "a100-80gb-sxm4",
    "a10080gbsxm": "a100-80gb-sxm4", "a10080gsxm": "a100-80gb-sxm4", "a10080gbpcie": "a100-80gb-pcie",
    "a10040gbsxm": "a100-40gb-sxm4", "a10040gbpcie": "a100-40gb-pcie", "a100pcie": "a100-80gb-pcie",
    "a800": "a800-80gb-sxm4", "h100": "h100-sxm5-80gb", "h100sxm": "h100-sxm5-80gb", "h100pcie": "h100-pcie-80gb",
    "h100nvl": "h100-nvl-94gb", "h800": "h800-sxm5-80gb", "h200": "h200-sxm-141gb", "h20": "h20-96gb",
    "gh200": "gh200-grace-hopper", "b200": "b200",
    "v100": "v100-sxm2-32gb", "v10032g": "v100-sxm2-32gb", "v10032gb": "v100-sxm2-32gb",
    "v10016g": "v100-sxm2-16gb", "v10016gb": "v100-sxm2-16gb", "v100pcie": "v100-pcie-32gb",
    "p100": "p100-pcie-16gb", "p40": "p40", "t4": "t4", "a10": "a10", "a10g": "a10g", "l4": "l4",
    "l40s": "l40s", "l40": "l40", "l20": "l20", "a40": "a40", "a30": "a30", "a16": "a16", "a6000": "rtx-a6000",
    "rtxa6000": "rtx-a6000", "a5000": "rtx-a5000", "a4000": "rtx-a4000", "5880": "rtx-5880-ada-generation",
    "rtx5880": "rtx-5880-ada-generation", "rtx5880ada": "rtx-5880-ada-generation",
    "6000ada": "rtx-6000-ada-generation", "rtx6000ada": "rtx-6000-ada-generation",
    "rtxpro6000": "rtx-pro-6000-blackwell-workstation-edition",
    "910b": "ascend-910b", "ascend910b": "ascend-910b", "910b4": "ascend-910b4", "ascend910b4": "ascend-910b4",
    "mi300x": "mi300x", "mi300": "mi300x", "mi250x": "mi250x", "mi250": "mi250x", "mi210": "mi210",
    "mi325x": "mi325x",
    # npu-smi prints the SKU: 910B1/910B2/910B2C/910B3 are the 64 GB part (gpus.csv row name)
    "910b1": "ascend-910b", "910b2": "ascend-910b", "910b2c": "ascend-910b", "910b3": "ascend-910b",
    # NVML / nvidia-smi names (memory type tells H100 SXM5 = HBM3 from PCIe = HBM2e)
    "H100 80GB HBM3": "h100-sxm5-80gb", "H100 SXM5 80GB": "h100-sxm5-80gb", "H100 PCIe": "h100-pcie-80gb",
    "A100-SXM4-80GB": "a100-80gb-sxm4", "A100-SXM4-40GB": "a100-40gb-sxm4", "A100-PCIE-40GB": "a100-40gb-pcie",
    "A100 80GB PCIe": "a100-80gb-pcie", "A800-SXM4-80GB": "a800-80gb-sxm4", "H800": "h800-sxm5-80gb",
    "H200": "h200-sxm-141gb", "H20": "h20-96gb", "GH200 480GB": "gh200-grace-hopper",
    "V100-SXM2-32GB": "v100-sxm2-32gb", "V100-SXM2-16GB": "v100-sxm2-16gb",
    "V100-PCIE-32GB": "v100-pcie-32gb", "V100-PCIE-16GB": "v100-pcie-16gb", "P100-PCIE-16GB": "p100-pcie-16gb",
}

HARDWARE_FILE_NAMES = ("hardware.toml", "hardware.yaml", "hardware.yml")
# Words that make a different card of the same number (RTX 4060 vs 4060 Ti, 4070 Ti vs Ti Super, 4090 vs
# 4090 D, L40 vs L40S, MI300 vs MI300X, H100 vs H100 NVL): a loose match may add memory sizes and form
# factors to what was typed, never one of these.
VARIANT_WORDS = frozenset({"ti", "super", "d", "s", "x", "xt", "nvl", "max", "c"})
_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "instinct", "amd", "huawei")


def _key(name: str) -> str:
    s = name.lower()
    for w in (*_VENDOR_WORDS, "generation", "edition"):
        s = s.replace(w, "")
    s = re.sub(r"[^a-z0-9]", "", s)
    s = s.replace("gb", "g") if re.search(r"\d+gb", s) else s
    return s


def _tokens(name: str) -> frozenset[str]:
    s = name.lower()
    for w in _VENDOR_WORDS:
        s = s.replace(w, " ")
    toks = re.findall(r"[a-z]+|\d+", s)
    return frozenset("gb" if t == "g" else t for t in toks)


def _bare_model(name: str) -> str:
    """'H100 80GB' -> 'h100': the model name without memory size, form factor or vendor."""
    s = re.sub(r"\d+\s*gb?\b", " ", name.lower())
    s = re.sub(r"\b(sxm\d?|pcie|hbm\d?e?)\b", " ", s)
    return _key(s)


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Accelerator]:
    text = resources.files("tuneplan.catalog").joinpath("accelerators.json").read_text(encoding="utf-8")
    return {d["id"]: Accelerator.from_dict(d) for d in json.loads(text)}


def catalog_accelerators() -> dict[str, Accelerator]:
    """The shipped catalog only (no user files)."""
    return dict(_catalog())


def hardware_file_candidates() -> list[str]:
    """Where the user's hardware file may be, in the order looked at (:func:`user_hardware_file`).

    ``$TUNEPLAN_CONFIG_DIR`` wins when set (and is the only place looked at, so tests and CI can point
    it at an empty directory); otherwise ``$XDG_CONFIG_HOME/tuneplan`` or ``~/.config/tuneplan``.
    """
    env = os.environ
    return list(_candidates(env.get("TUNEPLAN_CONFIG_DIR"), env.get("XDG_CONFIG_HOME"), env.get("HOME")))


@lru_cache(maxsize=8)
def _candidates(config_dir: str | None, xdg: str | None, home: str | None) -> tuple[str, ...]:
    """:func:`hardware_file_candidates` for these environment values (``~`` is ``$HOME``)."""
    d = config_dir or os.path.join(xdg or os.path.join(os.path.expanduser("~"), ".config"), "tuneplan")
    return tuple(os.path.join(d, n) for n in HARDWARE_FILE_NAMES)


def user_hardware_file() -> Path | None:
    """The user's hardware file from the config directory, if one exists (:func:`hardware_file_candidates`)."""
    for p in hardware_file_candidates():
        if os.path.isfile(p):
            return Path(p)
    return None


def config_dir() -> Path:
    """The user's tuneplan config directory: ``$TUNEPLAN_CONFIG_DIR`` when set, else
    ``$XDG_CONFIG_HOME/tuneplan`` or ``~/.config/tuneplan`` (it may not exist)."""
    env = os.environ
    return Path(env.get("TUNEPLAN_CONFIG_DIR") or os.path.join(
        env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "tuneplan"))


def accelerators(extra: dict[str, Accelerator] | str | os.PathLike[str] | None = None) -> dict[str, Accelerator]:
    """Catalog + the user's config-dir hardware file + ``extra`` (a dict, or a hardware file path)."""
    cat = dict(_catalog())
    cat.update(_config_folder_cards())
    if extra:
        cat.update(extra if isinstance(extra, dict) else load_hardware_file(extra))
    return cat


def _config_folder_cards() -> dict[str, Accelerator]:
    """The cards of the config folder's hardware file; a file that cannot be used is a warning naming it
    and its problem, and its cards are left out: a file the user did not name on this command line must
    not break every command (``--hardware-file`` given explicitly stays an error, exit 2)."""
    user = user_hardware_file()
    if user is None:
        return {}
    try:
        return load_hardware_file(user)
    except TuneplanError as exc:
        import warnings

        warnings.warn(f"the hardware file of the config folder is ignored: {exc.message}"
                      + (f" (accepted: {exc.accepted})" if exc.accepted else ""), stacklevel=3)
        return {}


def _index(cat: dict[str, Accelerator]) -> dict[str, str]:
    idx: dict[str, str] = {}
    # user aliases and ids first: a user's card named like a catalog alias wins
    for acc_id, acc in cat.items():
        for n in (acc_id, acc.name, *acc.aliases):
            idx.setdefault(_key(n), acc_id)
    for alias, acc_id in ALIASES.items():
        if acc_id in cat:
            idx.setdefault(_key(alias), acc_id)
    return idx


def _prefer(name: str, candidates: list[str], cat: dict[str, Accelerator]) -> str | None:
    """Several cards match: the bare model's default variant, else the only SXM card among them."""
    default = ALIASES.get(_bare_model(name))
    if default in candidates:
        return default
    sxm = [c for c in candidates if "sxm" in c or "sxm" in (cat[c].form_factor or "").lower()]
    return sxm[0] if len(sxm) == 1 else None


def resolve_accelerator(name: str, extra: dict[str, Accelerator] | str | os.PathLike[str] | None = None) -> Accelerator:
    """A catalog (or user) accelerator from a loose name; ``extra`` adds cards (dict or hardware file)."""
    return resolve_named(name, extra)[0]


def _same_model(toks: frozenset[str], acc_id: str, cat: dict[str, Accelerator]) -> bool:
    """The card adds no variant word to what was typed (in its id or any of its names)."""
    acc = cat[acc_id]
    return any(not ((_tokens(n) - toks) & VARIANT_WORDS) for n in (acc_id, acc.name, *acc.aliases))


def _ambiguous(name: str, ids: list[str]) -> UnknownNameError:
    return UnknownNameError(f"{name!r} matches several cards: {', '.join(ids)}", field="gpu", suggestions=ids,
                            accepted="one of these ids (see `tuneplan accelerators`)")


def _one_of(name: str, same: list[str], cat: dict[str, Accelerator]) -> Accelerator | None:
    """The one match, or the documented default among several (``_prefer``); several without one: error."""
    if len(same) == 1:
        return cat[same[0]]
    if same:
        if pick := _prefer(name, same, cat):
            return cat[pick]
        raise _ambiguous(name, same)
    return None


def _resolve(name: str, cat: dict[str, Accelerator]) -> Accelerator:
    """The card ``name`` means (:func:`_match`), refused when its variants differ in memory."""
    acc = _match(name, cat)
    _check_variants(name, acc, _variants(name, acc, cat))
    return acc


def _family(acc_id: str) -> str:
    """The card model of a catalog id without memory size and board: 'v100-sxm2-16gb' -> 'v100'."""
    return _bare_model(acc_id)


def _variants(name: str, acc: Accelerator, cat: dict[str, Accelerator]) -> list[Accelerator]:
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


def memory_families() -> dict[str, list[str]]:
    """The card models the shipped catalog sells in several memory sizes (a bare name is refused), with
    their card ids: ``{"v100": ["v100-pcie-16gb", ...], "a100": [...]}``."""
    by_family: dict[str, list[Accelerator]] = {}
    for acc in _catalog().values():
        by_family.setdefault(_family(acc.id), []).append(acc)
    return {fam: sorted(a.id for a in cards) for fam, cards in sorted(by_family.items())
            if len({_memory_size(a) for a in cards}) > 1}


def _check_variants(name: str, acc: Accelerator, others: list[Accelerator]) -> None:
    if any(_memory_size(o) != _memory_size(acc) for o in others):
        cards = sorted([acc, *others], key=lambda a: (_memory_size(a), a.id))
        sizes = " or ".join(dict.fromkeys(f"{_memory_size(a):g} GB" for a in cards))
        raise UnknownNameError(f"{name!r} names {len(cards)} cards with {sizes} of memory, and the verdict "
                               "depends on which", field="gpu", suggestions=[a.id for a in cards],
                               accepted="the card's id")


def resolve_named(name: str, extra: dict[str, Accelerator] | str | os.PathLike[str] | None = None
                  ) -> tuple[Accelerator, str | None]:
    """:func:`resolve_accelerator` and the choice a face prints beside the card when ``name`` also names
    other boards of the same memory ("a100-80gb read as a100-80gb-sxm4, not a100-80gb-pcie"), else
    None."""
    if not isinstance(name, str) or not name.strip():
        raise TuneplanError("empty accelerator name", field="gpu", accepted="a catalog id, e.g. rtx-4090, a100-80gb")
    cat = accelerators(extra)
    acc = _match(name, cat)
    others = _variants(name, acc, cat)
    _check_variants(name, acc, others)
    if not others:
        return acc, None
    return acc, f"{name.strip()} read as {acc.id}, not {', '.join(sorted(o.id for o in others))}"


def _match(name: str, cat: dict[str, Accelerator]) -> Accelerator:
    """Exact id, name or alias first; then loose matches of the same card model (never a variant: see
    VARIANT_WORDS). Several matches without a documented default are an error listing them."""
    if name in cat:
        return cat[name]
    idx = _index(cat)
    k = _key(name)
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
                           accepted="a catalog id (see `tuneplan accelerators`), or add it with {hardware_file}")


# ---- user hardware files ------------------------------------------------------------------------

_STR_FIELDS = {"name", "vendor", "compute_target", "bf16_support", "fp8_support", "tensor_cores", "interconnect",
               "memory_type", "cloud_price_date", "price_basis_and_date", "architecture", "form_factor", "source",
               "verified", "unverified_or_derived_fields", "notes"}
_NUM_FIELDS = {"memory_gb_marketed", "memory_gib_usable_observed", "bf16_tflops_dense", "fp16_fp16acc_tflops_dense",
               "fp8_tflops_dense", "int8_tops_dense", "fp32_tflops", "memory_bandwidth_gbs", "tdp_w",
               "launch_price_usd", "cloud_usd_per_gpu_hr"}
_INT_FIELDS = {"release_year", "devices_per_package"}
# Short spellings accepted in user files -> the catalog field they set.
_SHORTHANDS = {"memory_gib": "memory_gib_usable_observed", "memory_gb": "memory_gb_marketed",
               "bf16_tflops": "bf16_tflops_dense", "bandwidth_gbs": "memory_bandwidth_gbs",
               "cloud_usd_per_hr": "cloud_usd_per_gpu_hr"}
_BOOL_FIELDS = {"bf16": "bf16_support", "fp8": "fp8_support"}
_ACCEPTED = sorted(_STR_FIELDS | _NUM_FIELDS | _INT_FIELDS | set(_SHORTHANDS) | set(_BOOL_FIELDS)
                   | {"compute_capability", "aliases", "based_on"})


def _read_mapping(path: Path) -> dict[str, Any]:
    """A hardware file as a mapping, read within the limits of :mod:`tuneplan.safe_read`."""
    from tuneplan.safe_read import parse_toml, parse_yaml, read_text

    text = read_text(path, "hardware_file", accepted="a TOML or YAML hardware file")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        data = parse_toml(text, "hardware_file", str(path))
    elif suffix in (".yaml", ".yml"):
        data = parse_yaml(text, "hardware_file", str(path))[0] or {}
    else:
        raise TuneplanError(f"{path}: unknown file type {suffix[:16]!r}", field="hardware_file",
                            accepted=".toml, .yaml, .yml")
    if not isinstance(data, dict):
        raise TuneplanError(f"{path}: expected a table/mapping at the top", field="hardware_file",
                            accepted="[accelerators.<id>] tables (TOML) or an `accelerators:` mapping (YAML)")
    return data


def _coerce(path: Path, acc_id: str, key: str, value: Any) -> tuple[str, Any]:
    where = f"{path}: accelerators.{acc_id}.{key}"
    key_out = _SHORTHANDS.get(key, key)
    if key in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise TuneplanError(f"{where}: expected true/false, got {value!r}", field="hardware_file")
        return _BOOL_FIELDS[key], "yes" if value else "no"
    if key_out in _NUM_FIELDS:
        # an int compares exactly however large (1e400-style integers); only a float can be inf or NaN
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, float) and not math.isfinite(value)) or not 0 <= value <= MAX_HARDWARE_NUMBER):
            raise TuneplanError(f"{where}: expected a non-negative number, got {show_value(value)}",
                                field="hardware_file", accepted=f"a finite number in 0..{MAX_HARDWARE_NUMBER:g}")
        return key_out, float(value)
    if key_out in _INT_FIELDS:
        top = 4096 if key_out == "devices_per_package" else 9999  # devices in one package; a year
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
            raise TuneplanError(f"{where}: expected a positive integer, got {show_value(value)}",
                                field="hardware_file", accepted=f"an integer in 1..{top}")
        return key_out, value
    if key_out in _STR_FIELDS:
        if not isinstance(value, str) or len(value) > 4096:
            raise TuneplanError(f"{where}: expected a string, got {value!r}", field="hardware_file")
        return key_out, value
    if key == "compute_capability":
        cc = parse_cc(str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value)
        if cc is None:
            raise TuneplanError(f"{where}: expected \"major.minor\" such as \"8.9\", got {value!r}",
                                field="hardware_file")
        return key, cc
    if key == "aliases":
        if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
            raise TuneplanError(f"{where}: expected a list of strings", field="hardware_file")
        return key, tuple(value)
    raise TuneplanError(f"{where}: unknown field", field="hardware_file", accepted=_ACCEPTED)


@lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int) -> dict[str, Accelerator]:
    p = Path(path)
    data = _read_mapping(p)
    extra_top = sorted(str(k)[:64] for k in data if k != "accelerators")
    if extra_top or not isinstance(data.get("accelerators"), dict):
        raise TuneplanError(f"{p}: expected one top-level `accelerators` table"
                            + (f", found {extra_top}" if extra_top else ""), field="hardware_file",
                            accepted="[accelerators.<id>] in TOML, `accelerators: {<id>: {...}}` in YAML")
    base = _catalog()
    out: dict[str, Accelerator] = {}
    for acc_id, spec in data["accelerators"].items():
        if not isinstance(acc_id, str) or not acc_id.strip() or len(acc_id) > 255:
            raise TuneplanError(f"{p}: accelerators: {show_value(acc_id)} is not a card id", field="hardware_file",
                                accepted="an id of 1..255 characters, e.g. my-l40s")
        if not isinstance(spec, dict):
            raise TuneplanError(f"{p}: accelerators.{acc_id}: expected a table of fields", field="hardware_file")
        values = dict(_coerce(p, acc_id, k, v) for k, v in spec.items() if k != "based_on")
        based_on = spec.get("based_on")
        if based_on is not None:
            try:
                start = _resolve(str(based_on), {**base, **out})
            except TuneplanError:
                raise TuneplanError(f"{p}: accelerators.{acc_id}.based_on: unknown accelerator {based_on!r}",
                                    field="hardware_file", accepted="a catalog id (see `tuneplan accelerators`)") from None
            name = values.pop("name", f"{start.name} ({acc_id})")
            acc = replace(start, id=acc_id, name=name, origin=str(p), aliases=values.pop("aliases", ()), **{
                "source": f"{start.source} | changed by user hardware file {p}", **values})
        elif acc_id in base:  # override fields of a catalog card
            changed = ", ".join(sorted(values))
            acc = replace(base[acc_id], origin=str(p), **{
                "source": f"{base[acc_id].source} | {changed} from user hardware file {p}", **values})
        else:
            missing = [f for f in ("vendor",) if f not in values]
            if not values.get("memory_gb_marketed") and not values.get("memory_gib_usable_observed"):
                missing.append("memory_gib (as torch/nvidia-smi reports it) or memory_gb (marketed)")
            if missing:
                near = difflib.get_close_matches(_key(acc_id), [_key(i) for i in base], n=1, cutoff=0.6)
                hint = f" (or, to change catalog card {[i for i in base if _key(i) == near[0]][0]!r}, use its id)" if near else ""
                raise TuneplanError(f"{p}: accelerators.{acc_id}: a new accelerator needs {', '.join(missing)}{hint}",
                                    field="hardware_file", accepted=_ACCEPTED)
            values.setdefault("name", acc_id)
            values.setdefault("source", f"user hardware file {p}")
            values.setdefault("verified", "user")
            values.setdefault("memory_gb_marketed", None)
            acc = Accelerator(id=acc_id, origin=str(p), **values)
        out[acc_id] = acc
    return out


def load_hardware_file(path: str | os.PathLike[str]) -> dict[str, Accelerator]:
    """User accelerators from a TOML or YAML file, by id.

    ``[accelerators.<id>]`` with a catalog id overrides that card's fields (relative to the shipped
    catalog); ``based_on = "<catalog id or name>"`` starts a new card from a catalog card; otherwise a
    new card needs ``vendor`` and a memory figure. Errors name the file and the key.
    """
    from tuneplan.safe_read import user_path

    p = user_path(str(path), "hardware_file")
    try:
        if not p.is_file():
            raise TuneplanError(f"no such file: {p}", field="hardware_file")
        key = (str(p.resolve()), p.stat().st_mtime_ns)
    except (OSError, RuntimeError) as exc:  # a loop of links, a name too long
        raise TuneplanError(f"cannot read {p}: {getattr(exc, 'strerror', None) or exc}",
                            field="hardware_file") from None
    return dict(_load_cached(*key))


ACCELERATOR_FIELDS = tuple(f.name for f in fields(Accelerator))


# Host RAM per node without a figure for the card (no typical cloud instance, not this machine's): twice
# the node's GPU memory, at least 64 GiB. A desktop board with one consumer card commonly holds 2 x 32 GB;
# a server node holds more RAM than GPU memory (a DGX A100 node: 640 GB of GPU memory, 2 TB of RAM, NVIDIA
# DGX A100 user guide). The one sentence every face states:
HOST_DEFAULT_MIN_GIB = 64
HOST_DEFAULT_TEXT = f"twice the node's GPU memory, at least {HOST_DEFAULT_MIN_GIB} GiB"


@lru_cache(maxsize=1)
def _cloud_hosts() -> dict[str, dict[str, Any]]:
    import csv
    import io

    text = resources.files("tuneplan.catalog").joinpath("cloud_hosts.csv").read_text(encoding="utf-8")
    return {r["accelerator"]: {"instance": r["instance"], "gpus": int(r["gpus"]),
                               "host_bytes": int(float(r["host_gib"]) * 2**30), "source": r["source"]}
            for r in csv.DictReader(io.StringIO(text))}


def cloud_host(acc_id: str) -> dict[str, Any] | None:
    """The typical cloud instance with this card (``catalog/cloud_hosts.csv``: instance, GPUs, host RAM in
    bytes, source), or None where the catalog names none."""
    got = _cloud_hosts().get(acc_id)
    return dict(got) if got is not None else None
