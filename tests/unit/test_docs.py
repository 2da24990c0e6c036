"""The documentation follows the code: the settings reference is generated from the settings
module (every key, variable, flag, default and reload class), and the metrics page names every
family the collectors can export."""

from __future__ import annotations

import sys
from pathlib import Path

from nodeagent.settings import SPECS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_every_setting_is_in_the_settings_reference() -> None:
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import reference  # docs/hooks/reference.py: what the site's build runs
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in reference.settings_page().splitlines()
        if line.startswith("| `")
    }
    for spec in SPECS:
        row = rows.get(spec.dotted)
        assert row is not None, f"the settings reference has no row for {spec.dotted}"
        for var in spec.env:
            assert f"`{var}`" in row, (spec.dotted, var)
        if spec.flag:
            assert spec.flag in row, (spec.dotted, spec.flag)
        assert ("| yes |" if spec.hot else "| restart |") in row, row
    cli = reference.cli_page()
    assert "## Exit codes" in cli and "## `nodeagent mig apply`" in cli


def test_every_metric_family_is_in_the_metrics_page() -> None:
    """The metrics page names every family the collectors can export (a name written with
    braces, `nodeagent_gpu_memory_{total,used}_bytes`, counts for each)."""
    import itertools
    import re

    page = (DOCS / "metrics.md").read_text()
    documented: set[str] = set()
    for name in re.findall(r"nodeagent_[a-z_{},]+", page):
        parts = re.split(r"\{([a-z_,]+)\}", name)
        choices = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
        documented |= {"".join(c) for c in itertools.product(*choices)}
    in_code = set()
    for path in (ROOT / "nodeagent" / "metrics").glob("*.py"):
        names = re.findall(r'"(nodeagent_[a-z_]+)"', path.read_text())
        in_code |= {n for n in names if n.count("_") >= 2}  # not a prefix like "nodeagent_gpu"
    assert len(in_code) > 30  # the scan found the collectors
    # A counter family NAME is exported as NAME_total.
    missing = {n for n in in_code if n not in documented and n + "_total" not in documented}
    assert not missing, f"metrics missing from docs/metrics.md: {sorted(missing)}"
