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


def _trace_claim() -> ModuleType:
    path = REPO / "benchmarks" / "trace_claim.py"
    spec = importlib.util.spec_from_file_location("trace_claim", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_claim_flow_is_the_route_a_claim_takes(tmp_path: Path) -> None:
    """One claim traced on the emulator (benchmarks/trace_claim.py): every file on the stack
    at the first NVML write (the emulator's and the NVML session's aside) is a step of the
    picture's claim flow, in its order; the engine (reconcile/, mig/) never calls back into
    dra/; the ownership record is read at most 4 times for the prepare."""
    result = _trace_claim().trace(tmp_path)
    on_stack = []
    for frame in result["route"]:
        name = frame.split(":")[0].removeprefix("nodeagent/")
        if not name.startswith("sim/") and name != "nvml/session.py" and name not in on_stack:
            on_stack.append(name)
    ((_, _, _, steps),) = [f for f in _picture().FLOWS if f[0] == "a DRA claim to NVML"]
    flow = [name for _, name, _ in steps]
    assert [name for name in flow if name in on_stack] == on_stack
    callers = [what.split(" -> ")[0] for what, _ in result["callbacks"]]
    assert [c for c in callers if c.startswith(("nodeagent/reconcile/", "nodeagent/mig/"))] == []
    assert result["record_reads"] <= 4
