"""catalog/hardware_file.py: user cards in TOML or YAML, added, overriding a catalog card or based on one,
every field checked and every error naming the file and the key."""

from __future__ import annotations

import os

import pytest

from tuneplan.catalog.hardware_file import load_hardware_file
from tuneplan.catalog.shipped import shipped_cards
from tuneplan.errors import TuneplanError

GIB = 1024**3


def write(tmp_path, text: str, name: str = "hw.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_a_new_card(tmp_path):
    path = write(tmp_path, '[accelerators.lab-card]\nvendor = "nvidia"\nmemory_gib = 20\nbf16 = true\n'
                           'compute_capability = "8.9"\nbf16_tflops = 100\n')
    card = load_hardware_file(path)["lab-card"]
    assert card.memory_bytes == 20 * GIB  # memory_gib: as torch / nvidia-smi report it
    assert (card.bf16_support, card.compute_capability, card.bf16_tflops_dense) == ("yes", (8, 9), 100.0)
    assert (card.name, card.verified, card.origin) == ("lab-card", "user", path)


def test_overriding_a_catalog_card_keeps_its_other_fields(tmp_path):
    path = write(tmp_path, '[accelerators.rtx-4090]\ncloud_usd_per_hr = 0.5\n')
    card = load_hardware_file(path)["rtx-4090"]
    shipped = shipped_cards()["rtx-4090"]
    assert card.cloud_usd_per_gpu_hr == 0.5
    assert (card.name, card.memory_bytes) == (shipped.name, shipped.memory_bytes)
    assert card.source.endswith(f"cloud_usd_per_gpu_hr from user hardware file {path}")
    assert shipped_cards()["rtx-4090"].cloud_usd_per_gpu_hr == shipped.cloud_usd_per_gpu_hr  # not changed


def test_a_card_based_on_a_catalog_card(tmp_path):
    path = write(tmp_path, 'accelerators:\n  my-4090:\n    based_on: "4090"\n    memory_gib: 22\n'
                           '    aliases: [lab4090]\n', "hw.yaml")
    card = load_hardware_file(path)["my-4090"]
    base = shipped_cards()["rtx-4090"]
    assert card.name == f"{base.name} (my-4090)" and card.memory_bytes == 22 * GIB
    assert card.bf16_tflops_dense == base.bf16_tflops_dense and card.aliases == ("lab4090",)


@pytest.mark.parametrize("text, words", [
    ('[accelerators.x]\nvendor = "nvidia"\nmemory_gib = 8\ncolour = "red"\n', "unknown field"),
    ('[accelerators.x]\nvendor = "nvidia"\nmemory_gib = -8\n', "non-negative number"),
    ('[accelerators.x]\nvendor = "nvidia"\nmemory_gib = inf\n', "non-negative number"),
    ('[accelerators.x]\nvendor = "nvidia"\nmemory_gib = 8\nbf16 = "yes"\n', "true/false"),
    ('[accelerators.x]\nvendor = "nvidia"\nmemory_gib = 8\ncompute_capability = "eight"\n', "major.minor"),
    ('[accelerators.x]\nvendor = "nvidia"\nmemory_gib = 8\nrelease_year = 0\n', "positive integer"),
    ('[accelerators.x]\nmemory_gib = 8\n', "needs vendor"),
    ('[accelerators.x]\nvendor = "nvidia"\n', "memory_gib"),
    ('[accelerators.x]\nbased_on = "no-such-card-9000"\n', "unknown accelerator"),
    ('[cards.x]\nvendor = "nvidia"\n', "one top-level `accelerators` table"),
])
def test_errors_name_the_file_and_the_key(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(TuneplanError) as err:
        load_hardware_file(path)
    assert err.value.field == "hardware_file"
    assert words in err.value.message and path in err.value.message


def test_a_new_card_named_like_a_catalog_id_gets_a_hint(tmp_path):
    with pytest.raises(TuneplanError, match="to change catalog card 'rtx-4090'"):
        load_hardware_file(write(tmp_path, '[accelerators.rtx4090]\nmemory_gib = 20\n'))


def test_file_type_and_missing_file(tmp_path):
    with pytest.raises(TuneplanError) as err:
        load_hardware_file(write(tmp_path, "{}", "hw.json"))
    assert err.value.accepted == ".toml, .yaml, .yml"
    with pytest.raises(TuneplanError, match="no such file"):
        load_hardware_file(tmp_path / "missing.toml")


def test_an_edited_file_is_read_again(tmp_path):
    path = write(tmp_path, '[accelerators.lab]\nvendor = "nvidia"\nmemory_gib = 10\n')
    assert load_hardware_file(path)["lab"].memory_bytes == 10 * GIB
    write(tmp_path, '[accelerators.lab]\nvendor = "nvidia"\nmemory_gib = 12\n')
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a later modification time
    assert load_hardware_file(path)["lab"].memory_bytes == 12 * GIB


def test_the_result_is_a_copy(tmp_path):
    path = write(tmp_path, '[accelerators.lab]\nvendor = "nvidia"\nmemory_gib = 10\n')
    load_hardware_file(path).clear()
    assert "lab" in load_hardware_file(path)
