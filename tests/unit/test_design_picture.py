"""docs/img/design.svg is docs/hooks/design_picture.py's output, and it names what exists: each
floor's packages (as docs/design.md's floor table has them) and each flow's files."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docs" / "hooks" / "design_picture.py"


def _picture() -> ModuleType:
    spec = importlib.util.spec_from_file_location("design_picture", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_picture_is_the_scripts_output() -> None:
    picture = _picture()
    assert picture.OUT.read_text() == picture.render(), (
        "docs/img/design.svg is stale: run python docs/hooks/design_picture.py"
    )


def test_the_picture_names_packages_and_files_that_exist() -> None:
    picture = _picture()
    for _, packages in picture.FLOORS:
        for package in packages.split(" | "):
            assert (REPO / "nodeagent" / package).is_dir(), package
    for title, _, _, steps in picture.FLOWS:
        floors = dict(picture.FLOORS)
        for floor, name, _ in steps:
            assert (REPO / "nodeagent" / name).is_file(), f"{title}: {name}"
            package = name.split("/")[0] + "/"
            assert package in floors[floor].split(" | "), f"{title}: {name} is not on {floor}"


def test_the_floors_are_those_of_the_design_page() -> None:
    table = re.findall(r"^\| (\d+) \| (.+?) \|", (REPO / "docs" / "design.md").read_text(), re.M)
    page = [(int(n), " | ".join(re.findall(r"`([a-z]+/)`", cell))) for n, cell in table]
    assert page == list(_picture().FLOORS)
