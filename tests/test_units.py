import pytest

from ucudnn.errors import InputError
from ucudnn.units import format_size, parse_size


@pytest.mark.parametrize("text,expected", [
    ("64MiB", 64 << 20), ("64 MiB", 64 << 20), ("64mib", 64 << 20), ("512MB", 512_000_000), ("1GiB", 1 << 30),
    ("1.5GiB", 3 << 29), ("4096", 4096), ("8KiB", 8192), ("2KB", 2000), ("0", 0), (1234, 1234), ("1e3", 1000),
])
def test_sizes_accept_binary_decimal_and_plain_bytes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1MiB", "64 MiBs", "lots", "", "1e30", 10**30, float("nan"), True, None, [64]])
def test_bad_sizes_are_refused_naming_the_field(bad):
    with pytest.raises(InputError, match="workspace_limit"):
        parse_size(bad, "workspace_limit")


def test_zero_can_be_refused():
    with pytest.raises(InputError, match="positive"):
        parse_size("0MiB", "total_workspace", allow_zero=False)


def test_format_size_is_readable():
    assert format_size(64 << 20) == "64 MiB"
    assert format_size(512) == "512 B"
    assert format_size(3 << 29) == "1.5 GiB"
