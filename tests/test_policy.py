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
