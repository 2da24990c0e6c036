"""A pinned memory limit read back from the MPS control daemon (nodeagent.mps.control
.limit_holds): the daemon prints 1 GiB or more in whole G, truncated."""

from __future__ import annotations

import pytest

from nodeagent.mps.control import limit_holds

MIB, GIB = 1 << 20, 1 << 30


@pytest.mark.parametrize(
    ("got", "want", "holds"),
    [
        (None, 8 * GIB, False),  # unset
        (8 * GIB, 8 * GIB, True),
        (35 * GIB, 35942 * MIB, True),  # set 35942M, printed 35G (a real H200)
        (34 * GIB, 35942 * MIB, False),
        (512 * MIB, 512 * MIB, True),
        (0, 512 * MIB, False),  # below 1 GiB nothing is cut
    ],
)
def test_a_limit_read_back_in_whole_gib_holds(got: int | None, want: int, holds: bool) -> None:
    assert limit_holds(got, want) is holds
