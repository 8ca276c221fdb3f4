import pytest

from ucudnn.errors import InputError
from ucudnn.policy import micro_batch_sizes, normalize_policy


def test_power_of_two_includes_the_mini_batch_itself():
    assert micro_batch_sizes("powerOfTwo", 255) == [1, 2, 4, 8, 16, 32, 64, 128, 255]
    assert micro_batch_sizes("powerOfTwo", 256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_all_and_undivided():
    assert micro_batch_sizes("all", 5) == [1, 2, 3, 4, 5]
    assert micro_batch_sizes("undivided", 256) == [256]


def test_policy_names_are_case_insensitive_but_unknown_ones_fail():
    assert normalize_policy("poweroftwo") == "powerOfTwo"
    with pytest.raises(InputError, match="batch_policy"):
        normalize_policy("half")


def test_midpoints_adds_the_size_halfway_between_each_pair_of_powers_of_two():
    assert micro_batch_sizes("powerOfTwoAndMidpoints", 256) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
                                                                256]
    assert micro_batch_sizes("powerOfTwoAndMidpoints", 100) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 100]
    assert micro_batch_sizes("midpoints", 7) == [1, 2, 3, 4, 6, 7]


def test_midpoints_holds_every_power_of_two_size():
    for batch in range(1, 300):
        assert set(micro_batch_sizes("powerOfTwo", batch)) <= set(micro_batch_sizes("powerOfTwoAndMidpoints", batch))
