"""Every nodeagent name a benchmark script imports exists, wherever the import sits (many run
only on the GPU machine or against the real control plane, and import inside functions): a
module moved or renamed fails here, not at the next run on a GPU (benchmarks/metrics_server.py
imported nodeagent.logs after it had moved to nodeagent.base.logs)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "benchmarks").rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) of each import of nodeagent in the file, at any depth."""
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [
                (node.lineno, a.name, None)
                for a in node.names
                if a.name.split(".")[0] == "nodeagent"
            ]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "nodeagent"
        ):
            out += [(node.lineno, str(node.module), a.name) for a in node.names]
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_each_nodeagent_import_of_a_benchmark_resolves(script: Path) -> None:
    missing = []
    for line, module, name in _imports(script):
        try:
            found = importlib.import_module(module)
        except ImportError:
            missing.append(f"{script.name}:{line}: no module {module}")
            continue
        if name is not None and not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{script.name}:{line}: {module} has no {name}")
    assert missing == []
