"""catalog/cloud_hosts.py: the typical cloud instance beside a card, from the shipped table."""

from __future__ import annotations

from tuneplan.catalog.cloud_hosts import HOST_DEFAULT_MIN_GIB, HOST_DEFAULT_TEXT, cloud_host
from tuneplan.catalog.shipped import shipped_cards


def test_an_aws_g5_node_by_hand():
    # AWS EC2 G5: g5.48xlarge has 8 A10G GPUs and 768 GiB of memory
    host = cloud_host("a10g")
    assert host is not None
    assert (host["instance"], host["gpus"], host["host_bytes"]) == ("g5.48xlarge", 8, 768 * 2**30)
    assert "AWS" in host["source"]


def test_a_card_without_an_instance_is_none():
    assert cloud_host("no-such-card") is None


def test_every_row_names_a_shipped_card():
    from tuneplan.catalog.cloud_hosts import _cloud_hosts

    assert set(_cloud_hosts()) <= set(shipped_cards())


def test_the_result_is_a_copy():
    host = cloud_host("a10g")
    assert host is not None
    host["gpus"] = 1
    assert cloud_host("a10g")["gpus"] == 8


def test_the_default_is_stated_with_its_floor():
    assert str(HOST_DEFAULT_MIN_GIB) in HOST_DEFAULT_TEXT and "GiB" in HOST_DEFAULT_TEXT
