"""User hardware files: cards added or changed in a TOML or YAML file (``--hardware-file``, or the
config folder's ``hardware.toml|yaml``), checked field by field; see :func:`load_hardware_file`."""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from tuneplan.catalog.card_names import name_key, resolve_in
from tuneplan.catalog.shipped import shipped_cards
from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator, parse_cc
from tuneplan.specs.limits import MAX_HARDWARE_NUMBER, show_value

_STR_FIELDS = {"name", "vendor", "compute_target", "bf16_support", "fp8_support", "tensor_cores",
               "interconnect", "memory_type", "cloud_price_date", "price_basis_and_date", "architecture",
               "form_factor", "source", "verified", "unverified_or_derived_fields", "notes"}
_NUM_FIELDS = {"memory_gb_marketed", "memory_gib_usable_observed", "bf16_tflops_dense",
               "fp16_fp16acc_tflops_dense", "fp8_tflops_dense", "int8_tops_dense", "fp32_tflops",
               "memory_bandwidth_gbs", "tdp_w", "launch_price_usd", "cloud_usd_per_gpu_hr"}
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
                or (isinstance(value, float) and not math.isfinite(value))
                or not 0 <= value <= MAX_HARDWARE_NUMBER):
            raise TuneplanError(f"{where}: expected a non-negative number, got {show_value(value)}",
                                field="hardware_file",
                                accepted=f"a finite number in 0..{MAX_HARDWARE_NUMBER:g}")
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
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        cc = parse_cc(str(value) if number else value)
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
    base = shipped_cards()
    out: dict[str, Accelerator] = {}
    for acc_id, spec in data["accelerators"].items():
        if not isinstance(acc_id, str) or not acc_id.strip() or len(acc_id) > 255:
            raise TuneplanError(f"{p}: accelerators: {show_value(acc_id)} is not a card id",
                                field="hardware_file", accepted="an id of 1..255 characters, e.g. my-l40s")
        if not isinstance(spec, dict):
            raise TuneplanError(f"{p}: accelerators.{acc_id}: expected a table of fields",
                                field="hardware_file")
        values = dict(_coerce(p, acc_id, k, v) for k, v in spec.items() if k != "based_on")
        based_on = spec.get("based_on")
        if based_on is not None:
            try:
                start = resolve_in(str(based_on), {**base, **out})
            except TuneplanError:
                raise TuneplanError(f"{p}: accelerators.{acc_id}.based_on: unknown accelerator {based_on!r}",
                                    field="hardware_file",
                                    accepted="a catalog id (see `tuneplan accelerators`)") from None
            name = values.pop("name", f"{start.name} ({acc_id})")
            acc = replace(start, id=acc_id, name=name, origin=str(p), aliases=values.pop("aliases", ()), **{
                "source": f"{start.source} | changed by user hardware file {p}", **values})
        elif acc_id in base:  # override fields of a catalog card
            changed = ", ".join(sorted(values))
            acc = replace(base[acc_id], origin=str(p), **{
                "source": f"{base[acc_id].source} | {changed} from user hardware file {p}", **values})
        else:
            acc = _new_card(p, acc_id, values, base)
        out[acc_id] = acc
    return out


def _new_card(p: Path, acc_id: str, values: dict[str, Any], base: dict[str, Accelerator]) -> Accelerator:
    """A card that is neither a catalog card nor ``based_on`` one: it needs a vendor and a memory figure."""
    missing = [f for f in ("vendor",) if f not in values]
    if not values.get("memory_gb_marketed") and not values.get("memory_gib_usable_observed"):
        missing.append("memory_gib (as torch/nvidia-smi reports it) or memory_gb (marketed)")
    if missing:
        near = difflib.get_close_matches(name_key(acc_id), [name_key(i) for i in base], n=1, cutoff=0.6)
        close = [i for i in base if near and name_key(i) == near[0]]
        hint = f" (or, to change catalog card {close[0]!r}, use its id)" if near else ""
        raise TuneplanError(f"{p}: accelerators.{acc_id}: a new accelerator needs "
                            f"{', '.join(missing)}{hint}", field="hardware_file", accepted=_ACCEPTED)
    values.setdefault("name", acc_id)
    values.setdefault("source", f"user hardware file {p}")
    values.setdefault("verified", "user")
    values.setdefault("memory_gb_marketed", None)
    return Accelerator(id=acc_id, origin=str(p), **values)


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

