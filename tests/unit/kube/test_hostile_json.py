"""JSON from the cluster that anybody could have written, read without Python's text or a
RecursionError: the Node's owned-labels annotation, a watch's event lines (issue 39 class 1)."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.kube.nodelabels import OWNED_LABELS, owned_before
from nodeagent.kube.transport import LineTooLong, json_lines

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("raw", "owned"),
    [
        ('["nvidia.com/mig.capable", 5]', {"nvidia.com/mig.capable"}),
        (DEEP, set()),
        ("5", set()),
        ('{"a": 1}', set()),
        ('"nvidia.com/x"', set()),
        ("not json", set()),
        ("9" * 5000, set()),
        ("\udcff", set()),
        (None, set()),
        (7, set()),
    ],
    ids=["list", "deep", "number", "object", "string", "text", "long-number", "surrogate",
         "none", "not-text"],
)  # fmt: skip
def test_the_owned_labels_annotation_is_read_whatever_it_holds(raw: Any, owned: set[str]) -> None:
    assert owned_before({"metadata": {"annotations": {OWNED_LABELS: raw}}}) == owned


class _Stream:
    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        return iter(self.chunks)


def test_a_watch_line_nested_too_deeply_is_a_value_error_the_watch_says_in_words() -> None:
    good = b'{"type": "ADDED", "object": {}}\n'
    events = json_lines(_Stream(good, DEEP.encode() + b"\n"))
    assert next(events) == {"type": "ADDED", "object": {}}
    with pytest.raises(ValueError, match="nested too deeply"):
        next(events)


def test_a_watch_line_is_joined_across_chunks_and_ends_the_watch_past_its_bound() -> None:
    split = _Stream(b'{"type": "ADD', b'ED", "object": {}}\n{"type": "MOD', b'IFIED"}\n\n')
    assert [e["type"] for e in json_lines(split)] == ["ADDED", "MODIFIED"]
    good = b'{"type": "ADDED", "object": {}}\n'
    endless = json_lines(_Stream(good + b"x" * 40, b"x" * 40, b"x" * 40), max_line_bytes=100)
    assert next(endless) == {"type": "ADDED", "object": {}}
    with pytest.raises(LineTooLong, match="over 100 bytes"):
        next(endless)
