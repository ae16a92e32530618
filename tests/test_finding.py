"""A finding is plain data every face reads: its dict is its fields, and it lives below every package
that makes one (specs/)."""

from __future__ import annotations

from tuneplan.specs.finding import Finding


def test_to_dict_is_the_fields() -> None:
    f = Finding("error", "bf16-unsupported", "no bf16 here", fix="use {precision=fp16-mixed}", source="docs")
    assert f.to_dict() == {"level": "error", "code": "bf16-unsupported", "message": "no bf16 here",
                           "fix": "use {precision=fp16-mixed}", "source": "docs"}
    assert Finding("info", "c", "m").to_dict()["fix"] == ""
