"""plan/table.py: the size x method table, computed by the estimator, beside the folk ranges."""

from __future__ import annotations

from tuneplan.plan.table import METHODS, RULE_OF_THUMB_GB, SIZES, size_method_table


def test_the_table_orders_as_the_methods_and_sizes_do():
    cells = size_method_table(seq=512, batch=1)
    assert len(cells) == len(SIZES) * len(METHODS)
    by = {(c.size, c.method): c for c in cells}
    labels = [label for label, _ in METHODS]
    for size, _ in SIZES:
        peaks = [by[(size, label)].device_peak_bytes for label in labels]
        # full 16-bit > LoRA 16-bit > QLoRA 8-bit > QLoRA 4-bit: each keeps fewer bytes per weight
        assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks), size
        for label in labels:
            c = by[(size, label)]
            assert c.allocated_peak_bytes < c.device_peak_bytes  # the CUDA context sits above allocated
    for label in labels:
        peaks = [by[(size, label)].device_peak_bytes for size, _ in SIZES]
        assert peaks == sorted(peaks), label  # 7B < 13B < 32B < 70B


def test_lora_16_bit_weights_dominate_a_7b_lora():
    # Llama-2-7B: 6.74 B parameters x 2 bytes = 12.55 GiB of frozen weights alone; the LoRA peak is above
    # that and below twice that (adapters, activations at 512 tokens and the context are small beside it)
    by = {(c.size, c.method): c for c in size_method_table(seq=512, batch=1)}
    peak = by[("7B", "LoRA 16-bit")].device_peak_bytes
    weights = 6_738_415_616 * 2
    assert weights < peak < 2 * weights


def test_every_size_has_a_folk_range_per_method():
    for size, _ in SIZES:
        assert len(RULE_OF_THUMB_GB[size]) == len(METHODS)
        for text in RULE_OF_THUMB_GB[size]:
            low, high = map(int, text.split("-"))
            assert low <= high
