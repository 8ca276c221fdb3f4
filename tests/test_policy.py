import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def test_even_splits_add_the_near_equal_parts_of_a_batch_that_is_no_power_of_two():
    assert micro_batch_sizes("powerOfTwoAndEvenSplits", 127) == [1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127]
    assert micro_batch_sizes("powerOfTwoAndEvenSplits", 100) == [1, 2, 3, 4, 6, 7, 8, 12, 13, 16, 25, 32, 50, 64,
                                                                  100]
    assert normalize_policy("evensplits") == normalize_policy("EVEN_SPLITS") == "powerOfTwoAndEvenSplits"


@given(batch=st.integers(1, 4096))
def test_even_splits_keep_every_power_of_two_size_and_equal_power_of_two_on_a_power_of_two(batch):
    even, pow2 = micro_batch_sizes("powerOfTwoAndEvenSplits", batch), micro_batch_sizes("powerOfTwo", batch)
    assert set(pow2) <= set(even) and even == sorted(set(even)) and max(even) == batch and min(even) >= 1
    if batch & (batch - 1) == 0:
        assert even == pow2


@given(batch=st.integers(1, 4096), j=st.integers(0, 12))
def test_even_splits_cover_the_batch_with_2_to_the_j_near_equal_micro_batches(batch, j):
    """What the policy is for: any 2^j <= batch parts, each one of its sizes, sum to the batch (127 = 64 + 63)."""
    parts = 1 << j
    if parts > batch:
        return
    lo, hi = batch // parts, -(-batch // parts)
    n_hi = batch - lo * parts                     # that many parts of hi, the rest of lo
    assert n_hi * hi + (parts - n_hi) * lo == batch
    sizes = set(micro_batch_sizes("powerOfTwoAndEvenSplits", batch))
    assert lo in sizes and hi in sizes


def test_a_key_names_even_splits_on_a_power_of_two_as_powerOfTwo_whose_sizes_they_are():
    from ucudnn.policy import key_policy

    assert key_policy("evenSplits", 128) == "powerOfTwo" and key_policy("evenSplits", 127) == "powerOfTwoAndEvenSplits"
    assert key_policy("midpoints", 128) == "powerOfTwoAndMidpoints" and key_policy("powerOfTwo", 100) == "powerOfTwo"


@given(policy=st.sampled_from(["all", "powerOfTwo", "powerOfTwoAndMidpoints", "powerOfTwoAndEvenSplits",
                               "undivided"]), batch=st.integers(1, 2048))
def test_a_keys_policy_name_measures_the_same_sizes_as_the_policy_asked(policy, batch):
    from ucudnn.policy import key_policy

    assert micro_batch_sizes(key_policy(policy, batch), batch) == micro_batch_sizes(policy, batch)


def test_the_default_policy_adds_even_splits_only_where_the_batch_is_no_power_of_two(monkeypatch):
    """Unset, UCUDNN_BATCH_SIZE_POLICY means powerOfTwoAndEvenSplits: a power-of-two batch measures powerOfTwo's
    sizes under powerOfTwo's key (caches, bundles and the plan service's default request stay valid), an odd one
    also its even splits; set, the variable still decides (μ-cuDNN's name)."""
    from ucudnn import config
    from ucudnn.policy import key_policy

    monkeypatch.delenv("UCUDNN_BATCH_SIZE_POLICY", raising=False)
    default = config.batch_policy()
    assert default == "powerOfTwoAndEvenSplits"
    for b in (1, 2, 64, 128, 256):
        assert micro_batch_sizes(default, b) == micro_batch_sizes("powerOfTwo", b)
        assert key_policy(default, b) == "powerOfTwo"
    assert {15, 16, 31, 32, 63, 64, 127} <= set(micro_batch_sizes(default, 127))
    assert key_policy(default, 127) == "powerOfTwoAndEvenSplits"
    monkeypatch.setenv("UCUDNN_BATCH_SIZE_POLICY", "powerOfTwo")
    assert config.batch_policy() == "powerOfTwo"


def test_a_tables_plans_are_named_by_the_sizes_their_policy_measures_at_its_one_batch():
    from ucudnn.policy import key_policy_of

    assert key_policy_of("evenSplits", [256, 256]) == "powerOfTwo"          # the same sizes: powerOfTwo's name
    assert key_policy_of("powerOfTwoAndEvenSplits", [127]) == "powerOfTwoAndEvenSplits"
    assert key_policy_of("evenSplits", [256, 128]) == "powerOfTwoAndEvenSplits"   # several batches: its own name
    assert key_policy_of("pow2", iter([64])) == "powerOfTwo"
