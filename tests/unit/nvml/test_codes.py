"""NVML's return codes are named once (nodeagent.nvml.codes), with the values pynvml gives
them, and NVML's texts are the library's own."""

from __future__ import annotations

import pynvml

from nodeagent.nvml import codes

NAMES = [n for n in vars(codes) if n.isupper() and n not in ("MESSAGES", "GONE")]


def test_every_code_is_pynvml_s() -> None:
    assert len(NAMES) >= 15
    for name in NAMES:
        pynvml_name = "NVML_SUCCESS" if name == "SUCCESS" else f"NVML_ERROR_{name}"
        assert getattr(pynvml, pynvml_name) == getattr(codes, name), name


def test_the_texts_are_nvml_s_and_an_unnamed_code_says_its_number() -> None:
    assert codes.message_for(codes.IN_USE) == "In use by another client"
    assert codes.message_for(codes.LIBRARY_NOT_FOUND) == "NVML Shared Library Not Found"
    assert codes.message_for(12345) == "NVML error 12345"
    assert set(codes.MESSAGES) <= {getattr(codes, n) for n in NAMES}
    assert {getattr(codes, n) for n in NAMES} >= codes.GONE


def test_no_other_module_names_an_nvml_code_by_its_number() -> None:
    """The codes are compared by name everywhere: a bare `= 13  # FUNCTION_NOT_FOUND` in a
    module would drift from this table unseen."""
    import re
    from pathlib import Path

    package = Path(codes.__file__).parent.parent
    pattern = re.compile(
        r"^_?(NOT_FOUND|NOT_SUPPORTED|IN_USE|TIMEOUT|FUNCTION_NOT_FOUND|"
        r"INVALID_ARGUMENT|INSUFFICIENT_RESOURCES|SUCCESS|"
        r"NVML_ERROR_[A-Z_]+|NVML_(?:DRIVER|LIBRARY)_[A-Z_]+) = \d+",
        re.M,
    )
    found = [
        f"{path.relative_to(package)}: {m.group(0)}"
        for path in package.rglob("*.py")
        if path.name != "codes.py" and "sim" not in path.parts and "_pb2" not in path.name
        for m in pattern.finditer(path.read_text())
    ]
    assert found == []
