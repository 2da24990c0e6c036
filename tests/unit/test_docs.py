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
