"""Embedded data: model configs and accelerators, and name resolution."""
