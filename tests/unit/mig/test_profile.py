"""The MIG profile grammar, table-driven against go-nvlib's own cases
(NVIDIA/go-nvlib pkg/nvlib/device/mig_profile_test.go, 3c161560521e3208792199f2ed0d559a5f3ae4f4:
its validFormat column), and properties over generated names."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.mig import compute
from nodeagent.mig.profile import ProfileFormatError, ProfileName, parse_profile

VALID = [
    ("1g.5gb", ProfileName(1, 5, 1)),
    ("1c.1g.5gb", ProfileName(1, 5, 1)),
    ("1g.5gb+me", ProfileName(1, 5, 1, ("me",))),
    ("1c.1g.5gb+me", ProfileName(1, 5, 1, ("me",))),
    ("1c.1g.5gb-me", ProfileName(1, 5, 1, ("me",), negative=True)),
    ("1g.5gb+me.all", ProfileName(1, 5, 1, ("me.all",))),
    ("1g.5gb+gfx", ProfileName(1, 5, 1, ("gfx",))),
    ("1g.24gb-me", ProfileName(1, 24, 1, ("me",), negative=True)),
    ("0g.0gb", ProfileName(0, 0, 0)),  # the format holds; no GPU has it
    ("10000c.10000g.500000gb", ProfileName(10000, 500000, 10000)),
    ("1g.5gb+me,you,them", ProfileName(1, 5, 1, ("me", "them", "you"))),
    ("2c.3g.40gb", ProfileName(3, 40, 2)),
]

INVALID = [
    ("", "empty"),
    (" 1c.1g.5gb", "spaces"),
    ("1 c.1g.5gb", "spaces"),
    ("1c .1g.5gb", "spaces"),
    ("1c.1g.5gb ", "spaces"),
    ("1c . 1g . 5gb", "spaces"),
    ("1c.f1g.5gb", "malformed number"),
    ("1r.1g.5gb", "missing 'c'"),
    ("1g.5gbk", "missing 'gb'"),
    ("1g.5", "missing 'gb'"),
    ("g.5gb", "malformed number"),
    ("1g.gb", "malformed number"),
    ("1g.5gb+me,me", "listed twice"),
    ("1g.5gb+", "empty attribute"),
    ("1g.5gb+,,", "empty attribute"),
    ("1g.5gb+me,", "empty attribute"),
    ("1g.5gb+2me", "begins with a number"),
    ("1g.5gb*me", "missing 'gb'"),
    ("bogus", "expected"),
    ("1c.1g.5gb+.all", "begins or ends with a dot"),
    ("1c.1g.5gb+all.", "begins or ends with a dot"),
    ("1c.1g.5gb+me-me", "both '+' and '-'"),
    ("1c.1g.5gb-me+me", "both '+' and '-'"),
    ("1.2.3.4gb", "expected"),
]


@pytest.mark.parametrize(("text", "parsed"), VALID)
def test_valid_names(text: str, parsed: ProfileName) -> None:
    assert parse_profile(text) == parsed


@pytest.mark.parametrize(("text", "reason"), INVALID)
def test_invalid_names_say_why(text: str, reason: str) -> None:
    with pytest.raises(ProfileFormatError, match=re.escape(reason)):
        parse_profile(text)


def test_equal_names_compare_equal() -> None:
    assert parse_profile("1c.1g.5gb") == parse_profile("1g.5gb")
    assert parse_profile("1g.5gb+me,gfx") == parse_profile("1g.5gb+gfx,me")
    assert parse_profile("1g.5gb+me") != parse_profile("1g.5gb-me")
    assert parse_profile("1c.2g.10gb") != parse_profile("2c.2g.10gb")
    assert str(parse_profile("1c.3g.40gb+me")) == "1c.3g.40gb+me"
    assert parse_profile("2c.3g.40gb").gi == "3g.40gb"


ATTR = st.from_regex(r"[a-z][a-z0-9]{0,3}(\.[a-z0-9]{1,3})?", fullmatch=True)


@given(
    st.integers(0, 99),
    st.integers(1, 8),
    st.integers(0, 999),
    st.lists(ATTR, max_size=3, unique=True),
    st.booleans(),
)
def test_generated_names_round_trip(c: int, g: int, gb: int, attrs: list[str], neg: bool) -> None:
    text = f"{c}c.{g}g.{gb}gb" + (("-" if neg else "+") + ",".join(attrs) if attrs else "")
    parsed = parse_profile(text)
    assert (parsed.c, parsed.g, parsed.gb) == (c, g, gb)
    assert parse_profile(str(parsed)) == parsed


@given(st.text(max_size=20))
def test_any_text_parses_or_says_why(text: str) -> None:
    try:
        parse_profile(text)
    except ProfileFormatError as err:
        assert str(err)


def test_compute_instance_sizes_match_the_documented_listings() -> None:
    # Real `nvidia-smi mig -lcip` listings: no 3c in a 4g; 3c and 4c in a 7g; one 2c in a 3g.
    assert compute.sizes_offered(7) == (1, 2, 3, 4, 7)
    assert compute.sizes_offered(4) == (1, 2, 4)
    assert compute.sizes_offered(3) == (1, 2, 3)
    assert compute.sizes_offered(1) == (1,)
    assert compute.starts(3, 2) == (0,) and compute.starts(7, 3) == (0, 4)
    assert compute.pack(3, [1] * 6) == ((1, 1, 1), (1, 1, 1))
    assert compute.pack(3, [2, 2, 1, 1]) == ((2, 1), (2, 1))
    assert compute.pack(7, [4, 3]) == ((4, 3),)
    assert compute.pack(4, [3]) is None
