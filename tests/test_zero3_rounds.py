"""wrappers/zero3_rounds.py: the prefetcher's rounds, cut once per trace, by hand from DeepSpeed 0.19.8's
``_fetch_sub_module_impl`` (each fetch pops until it has taken min(max_live - available, bucket) elements,
the last one overshooting)."""

from tuneplan.estimator.wrappers.zero3_coordinator import prefetch_rounds
from tuneplan.estimator.wrappers.zero3_rounds import cut_rounds


def test_rounds_by_hand() -> None:
    # bucket 8, max_live 100: 5 (< 8) then 5 (10 >= 8) a round, twice
    assert cut_rounds((5, 5, 5, 5), 8, (0, 0), 100) == ((5, 5), (5, 5))
    # max_live 12: the first round takes 10 (limit min(12, 8)); the second's limit is 12 - 10 = 2, one
    # parameter of 5 overshoots it; then 15 live > 12: no more rounds
    assert cut_rounds((5, 5, 5, 5), 8, (0, 0), 12) == ((5, 5), (5,))
    # the first round's 10 elements released once it is popped: the second round's limit is 8 again
    assert cut_rounds((5, 5, 5, 5), 8, (1, 10), 12) == ((5, 5), (5, 5))


def test_each_caller_gets_its_own_lists() -> None:
    first = prefetch_rounds([3, 3, 3], 4)
    first[0].append(99)
    assert prefetch_rounds([3, 3, 3], 4) == [[3, 3], [3]]
