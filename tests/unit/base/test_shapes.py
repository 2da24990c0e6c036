"""The JSON shape check that every reader of API objects runs before it reads a field."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.base.shapes import MapOf, Shape, Unreadable, check, problem

SHAPE: Shape = {
    "metadata": {"name": str, "labels": MapOf(str), "generation": int},
    "items": [{"device": str, "admin": bool, "size": (str, int)}],
}


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ({}, None),
        ({"metadata": None, "items": None}, None),  # null: absent
        ({"metadata": {"name": "a", "other": [1]}, "items": [{"size": 3}]}, None),
        ([], ("the object", "is a list, not an object")),
        ({"metadata": []}, ("metadata", "is a list, not an object")),
        ({"metadata": {"labels": {"a": 1}}}, ("metadata.labels.a", "is a number, not a string")),
        ({"metadata": {"generation": True}}, ("metadata.generation", "is true or false, not a whole number")),
        ({"metadata": {"generation": 1000.0}}, ("metadata.generation", "is a number, not a whole number")),
        ({"items": "abc"}, ("items", "is a string, not a list")),
        ({"items": [{}, "x"]}, ("items[1]", "is a string, not an object")),
        ({"items": [{"admin": "yes"}]}, ("items[0].admin", "is a string, not true or false")),
        ({"items": [{"size": 1.5}]}, ("items[0].size", "is a number, not a string or a whole number")),
    ],
)  # fmt: skip
def test_the_first_wrong_field_is_named(value: Any, found: tuple[str, str] | None) -> None:
    assert problem(value, SHAPE) == found


def test_unreadable_is_one_sentence_and_its_field_has_no_indices() -> None:
    with pytest.raises(Unreadable) as err:
        check({"items": [{}, {"device": 4}]}, SHAPE, "claim a/b")
    assert str(err.value) == "claim a/b: items[1].device is a number, not a string"
    assert err.value.field == "items[].device"


def test_a_value_nested_100000_deep_is_checked_without_recursion() -> None:
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    nested: Shape = [object]
    assert problem({"items": deep}, {"items": nested}) is None
    assert problem({"metadata": {"name": deep}}, SHAPE) == (
        "metadata.name",
        "is a list, not a string",
    )
