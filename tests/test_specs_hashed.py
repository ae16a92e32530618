"""specs/hashed.py: a frozen record's hash runs once, equals the dataclass's, and stays out of a pickle."""

import dataclasses
import pickle

from tuneplan.specs.hashed import hash_once


@hash_once
@dataclasses.dataclass(frozen=True)
class Pair:
    a: int
    b: str
    note: str = dataclasses.field(default="", compare=False)


@dataclasses.dataclass(frozen=True)
class PlainPair:
    a: int
    b: str
    note: str = dataclasses.field(default="", compare=False)


def test_hash_is_the_dataclass_hash_and_kept() -> None:
    p = Pair(3, "x", note="ignored")
    # the dataclass hash is hash((a, b)) over the compared fields: the same value as the plain record's
    assert hash(p) == hash(PlainPair(3, "x")) == hash((3, "x"))
    assert p.__dict__["_hash_once"] == hash((3, "x"))
    assert {p: 1}[Pair(3, "x")] == 1  # equal records, equal hash: one key


def test_pickle_drops_the_kept_hash() -> None:
    p = Pair(3, "x")
    hash(p)
    q = pickle.loads(pickle.dumps(p))
    assert "_hash_once" not in q.__dict__ and q == p and hash(q) == hash(p)
