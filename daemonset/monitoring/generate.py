"""Writes prometheusrule.yaml (the Prometheus Operator's PrometheusRule) from rules.yaml, the
plain rule file promtool reads: rules.yaml is the one source of truth.

    python daemonset/monitoring/generate.py           # rewrite prometheusrule.yaml
    python daemonset/monitoring/generate.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yaml"
OUTPUT = HERE / "prometheusrule.yaml"

HEADER = """\
# GENERATED from rules.yaml by generate.py: edit rules.yaml, then run
#   python daemonset/monitoring/generate.py
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: nodeagent
  labels: {app.kubernetes.io/name: nodeagent}
spec:
"""


def render(rules_text: str) -> str:
    """The PrometheusRule: rules.yaml from its `groups:` line on, indented under `spec:`."""
    lines = rules_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = [("  " + line) if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main(argv: list[str]) -> int:
    wanted = render(RULES.read_text())
    if argv == ["--check"]:
        if not OUTPUT.exists() or OUTPUT.read_text() != wanted:
            print(
                f"{OUTPUT.name} is out of date: run python {Path(__file__).name}", file=sys.stderr
            )
            return 1
        return 0
    if argv:
        print("usage: generate.py [--check]", file=sys.stderr)
        return 2
    OUTPUT.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
