"""`--help` shows each flag's default: the settings' defaults as their flags take them (read
back through the settings loader, they are the defaults), and argparse's own."""

from __future__ import annotations

import pytest

from nodeagent.cli.common import DEFAULTS, setting_default
from nodeagent.settings import GROUPS, SPECS, Spec, load
from tests.support.cli import Result

SHOWN = [s for s in SPECS if s.flag and setting_default(s) is not None]


def test_most_settings_show_a_default() -> None:
    assert len(SHOWN) >= 35


@pytest.mark.parametrize("spec", SHOWN, ids=lambda s: s.dotted)
def test_a_shown_default_given_as_the_flag_is_the_default(spec: Spec) -> None:
    shown = setting_default(spec)
    assert shown is not None
    settings, sources = load({spec.dest: [shown] if spec.repeat else shown}, {}, None, GROUPS)
    assert sources[spec.dotted].kind == "flag"
    group = getattr(settings, spec.group)
    assert getattr(group, spec.field) == getattr(getattr(DEFAULTS, spec.group), spec.field)


@pytest.mark.parametrize(
    "args, shown",
    [
        (["--help"], "(NODEAGENT_RUN_DIR; node.run-dir; default: /run/nodeagent)"),
        (["status", "--help"], "(default: text)"),
        (["mig", "apply", "--help"], "mig.lock-timeout; default: 60)"),
        (["run", "--help"], "metrics.address; default: 0.0.0.0:9401)"),
        (["sim", "attach", "--help"], "(default: 1024)"),
        (["config", "check", "--help"], "(default: yaml)"),
    ],
)
def test_help_shows_defaults(cli: object, args: list[str], shown: str) -> None:
    res: Result = cli(*args)  # type: ignore[operator]
    assert res.returncode == 0, res.stderr
    assert shown in " ".join(res.stdout.split()), res.stdout
    assert "(default: None)" not in res.stdout and "default: False" not in res.stdout
