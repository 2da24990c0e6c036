"""The README's settings table is the settings module: every key, variable and flag, with its
reload class."""

from __future__ import annotations

from pathlib import Path

from nodeagent.settings import SPECS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_setting_is_in_the_readme_table() -> None:
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in README.read_text().splitlines()
        if line.startswith("| `") and line.count("|") == 6
    }
    for spec in SPECS:
        row = rows.get(spec.dotted)
        assert row is not None, f"README has no row for {spec.dotted}"
        for var in spec.env:
            assert f"`{var}`" in row, (spec.dotted, var)
        if spec.flag:
            assert spec.flag in row, (spec.dotted, spec.flag)
        assert row.rstrip(" |").endswith("hot" if spec.hot else "restart"), row


def test_every_metric_family_is_in_the_readme() -> None:
    """The README's metrics reference names every family the collectors can export (a name
    written with braces, `nodeagent_gpu_memory_{total,used}_bytes`, counts for each)."""
    import itertools
    import re

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    documented: set[str] = set()
    for name in re.findall(r"nodeagent_[a-z_{},]+", readme):
        parts = re.split(r"\{([a-z_,]+)\}", name)
        choices = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
        documented |= {"".join(c) for c in itertools.product(*choices)}
    in_code = set()
    for path in (root / "nodeagent" / "metrics").glob("*.py"):
        names = re.findall(r'"(nodeagent_[a-z_]+)"', path.read_text())
        in_code |= {n for n in names if n.count("_") >= 2}  # not a prefix like "nodeagent_gpu"
    assert len(in_code) > 30  # the scan found the collectors
    # A counter family NAME is exported as NAME_total.
    missing = {n for n in in_code if n not in documented and n + "_total" not in documented}
    assert not missing, f"metrics missing from README: {sorted(missing)}"
