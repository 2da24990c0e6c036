"""The settings loader as a user meets it: precedence of file, environment and flags, one
readable ConfigError naming where each bad value came from, a strict settings file, reloads
and the effective settings written back as a file."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.base.errors import ConfigError
from nodeagent.cli.commands import build_parser
from nodeagent.settings import (
    BY_KEY,
    DEFAULT_PAUSE_COMPONENTS,
    MAX_ERRORS,
    SPECS,
    Invalid,
    Settings,
    Source,
    Spec,
    as_document,
    load,
    merge_reload,
)

# -- helpers ------------------------------------------------------------------------------


def flags(**by_dotted: Any) -> dict[str, Any]:
    """Flag values as argparse hands them to `load`, given by each setting's dotted name."""
    return {BY_KEY[dotted].dest: value for dotted, value in by_dotted.items()}


def value_of(settings: Settings, spec: Spec) -> Any:
    return getattr(getattr(settings, spec.group), spec.field)


def settings_file(tmp_path: Path, body: str | bytes, name: str = "nodeagent.yaml") -> str:
    path = tmp_path / name
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(body)
    return str(path)


def one_setting_file(tmp_path: Path, spec: Spec, value: str) -> tuple[str, str]:
    """A file setting just `spec` to the YAML text `value`; and where that value starts."""
    file = settings_file(tmp_path, f"version: nodeagent/v1\n{spec.group}:\n  {spec.key}: {value}\n")
    return file, f"{file}:3:{len(spec.key) + 5}"


def load_error(**kwargs: Any) -> str:
    with pytest.raises(ConfigError) as err:
        load(**kwargs)
    return str(err.value)


def parse_cli(argv: list[str]) -> tuple[dict[str, Any], str | None, tuple[str, ...]]:
    """What the real command line hands to `load`: the flags, the settings file, the groups."""
    args = build_parser().parse_args(argv)
    return vars(args), getattr(args, "settings_file", None), args.groups


def load_cli(argv: list[str], environ: Mapping[str, str] | None = None) -> Settings:
    given, file, groups = parse_cli(argv)
    settings, _ = load(given, dict(environ or {}), file, groups)
    return settings


def _takes_seconds(spec: Spec) -> bool:
    try:
        parsed = spec.parse("2.5")
    except Invalid:
        return False
    return isinstance(parsed, float) and parsed == 2.5


# Every interval/timeout setting, found by what its parser does: a new one is covered here
# without touching this file.
SECONDS_SPECS = [s for s in SPECS if _takes_seconds(s)]
ZERO_ALLOWED = {"mig.lock-timeout", "node.nvml-wait"}  # 0: do not wait (MIG writer, NVML)


def test_seconds_settings_are_found() -> None:
    assert {s.dotted for s in SECONDS_SPECS} >= {
        "metrics.refresh-interval",
        "metrics.gpm-interval",
        "reconcile.interval",
        "mig.lock-timeout",
        "mps.probe-interval",
        "kube.clients-wait",
        "kube.watch-timeout",
    }


# -- precedence ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_file", "in_env", "in_flag", "expected", "source_kind"),
    [
        (False, False, False, 5.0, None),
        (True, False, False, 1.0, "file"),
        (False, True, False, 2.0, "env"),
        (False, False, True, 3.0, "flag"),
        (True, True, False, 2.0, "env"),
        (True, False, True, 3.0, "flag"),
        (False, True, True, 3.0, "flag"),
        (True, True, True, 3.0, "flag"),
    ],
)
def test_flag_beats_environment_beats_file(
    tmp_path: Path,
    in_file: bool,
    in_env: bool,
    in_flag: bool,
    expected: float,
    source_kind: str | None,
) -> None:
    file = settings_file(tmp_path, "version: nodeagent/v1\nmetrics:\n  refresh-interval: 1\n")
    settings, sources = load(
        flags(**{"metrics.refresh-interval": "3"}) if in_flag else {},
        {"NODEAGENT_REFRESH_INTERVAL": "2"} if in_env else {},
        file if in_file else None,
    )
    assert settings.metrics.refresh_interval_seconds == expected
    where = {
        "file": Source("file", f"{file}:3:21"),
        "env": Source("env", "NODEAGENT_REFRESH_INTERVAL"),
        "flag": Source("flag", "--refresh-interval"),
    }
    if source_kind is None:
        assert "metrics.refresh-interval" not in sources
    else:
        assert sources["metrics.refresh-interval"] == where[source_kind]


def test_settings_file_named_by_the_environment(tmp_path: Path) -> None:
    named = settings_file(tmp_path, "version: nodeagent/v1\nreconcile: {interval: 7}\n", "a.yaml")
    given = settings_file(tmp_path, "version: nodeagent/v1\nreconcile: {interval: 9}\n", "b.yaml")
    settings, _ = load(environ={"NODEAGENT_CONFIG": named})
    assert (settings.reconcile.interval_seconds, settings.file) == (7.0, named)
    settings, _ = load(environ={"NODEAGENT_CONFIG": named}, file=given)
    assert (settings.reconcile.interval_seconds, settings.file) == (9.0, given)


@pytest.mark.parametrize("shadowed", ["file", "env"])
def test_a_bad_value_is_reported_even_when_a_flag_overrides_it(
    tmp_path: Path, shadowed: str
) -> None:
    file = settings_file(tmp_path, "version: nodeagent/v1\nmetrics:\n  refresh-interval: abc\n")
    with pytest.raises(ConfigError, match=r"(?i)refresh"):
        load(
            flags(**{"metrics.refresh-interval": "3"}),
            {"NODEAGENT_REFRESH_INTERVAL": "abc"} if shadowed == "env" else {},
            file if shadowed == "file" else None,
        )


# -- every number of seconds, from every source --------------------------------------------

BAD_SECONDS_TEXT = ["nan", "NaN", "inf", "-inf", "1e999", "-1", "-0.5", "abc", "5s", "", " "]
BAD_SECONDS_YAML = [".nan", ".inf", "-.inf", "nan", "-1", "abc", "5s", "true", "[1]", "{a: 1}", "''", "null"]  # fmt: skip


def _bad_text_cases() -> list[Any]:
    cases = [(s, v) for s in SECONDS_SPECS for v in BAD_SECONDS_TEXT]
    cases += [(s, "0") for s in SECONDS_SPECS if s.dotted not in ZERO_ALLOWED]
    return [pytest.param(s, v, id=f"{s.dotted}={v!r}") for s, v in cases]


def _bad_yaml_cases() -> list[Any]:
    cases = [(s, v) for s in SECONDS_SPECS for v in BAD_SECONDS_YAML]
    cases += [(s, "0") for s in SECONDS_SPECS if s.dotted not in ZERO_ALLOWED]
    return [pytest.param(s, v, id=f"{s.dotted}={v}") for s, v in cases]


@pytest.mark.parametrize(("spec", "value"), _bad_text_cases())
def test_bad_seconds_from_a_flag_names_the_flag(spec: Spec, value: str) -> None:
    message = load_error(flags={spec.dest: value})
    assert message.startswith(f"{spec.flag}: must be a ")
    assert "seconds" in message and "\n" not in message


@pytest.mark.parametrize(("spec", "value"), _bad_text_cases())
def test_bad_seconds_from_the_environment_names_the_variable(spec: Spec, value: str) -> None:
    message = load_error(environ={spec.env[0]: value})
    assert message.startswith(f"environment variable {spec.env[0]}: must be a ")
    assert "seconds" in message and "\n" not in message


@pytest.mark.parametrize(("spec", "value"), _bad_yaml_cases())
def test_bad_seconds_from_the_file_names_the_position(
    tmp_path: Path, spec: Spec, value: str
) -> None:
    file, where = one_setting_file(tmp_path, spec, value)
    message = load_error(file=file)
    assert message.startswith(f"{where}: {spec.dotted}: must be a ")
    assert "seconds" in message and "\n" not in message


@pytest.mark.parametrize("spec", SECONDS_SPECS, ids=lambda s: s.dotted)
@pytest.mark.parametrize("source", ["flag", "env", "file"])
def test_good_seconds_are_taken_from_every_source(tmp_path: Path, spec: Spec, source: str) -> None:
    if source == "flag":
        settings, _ = load(flags={spec.dest: "2.5"})
    elif source == "env":
        settings, _ = load(environ={spec.env[0]: "2.5"})
    else:
        settings, _ = load(file=one_setting_file(tmp_path, spec, "2.5")[0])
    assert value_of(settings, spec) == 2.5


def test_zero_is_taken_only_where_it_means_something() -> None:
    for spec in SECONDS_SPECS:
        if spec.dotted in ZERO_ALLOWED:
            assert value_of(load(flags={spec.dest: "0"})[0], spec) == 0.0


# -- other values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dotted", "value", "words"),
    [
        ("metrics.gpm-interval", "0.05", "at least 0.1"),
        ("metrics.gpm-interval", "0", "at least 0.1"),
        ("mps.replicas", "1", ">= 2, not 1"),
        ("mps.replicas", "0", ">= 2, not 0"),
        ("mps.replicas", "abc", "whole number"),
        ("mps.replicas", "2.5", "whole number"),
        ("mps.thread-percentage", "0", "1-100, not 0"),
        ("mps.thread-percentage", "101", "1-100, not 101"),
        ("mps.pinned-memory", "2X", "'2X' is not a size"),
        ("mps.pinned-memory", "0=", "'' is not a size"),
        ("mps.pinned-memory", "0=0G", "'0G' is not a size"),
        ("mps.pinned-memory", "a=2G", "SIZE or INDEX=SIZE"),
        ("mps.pinned-memory", "=2G", "SIZE or INDEX=SIZE"),
        ("mps.pinned-memory", "0=2G,1=", "'' is not a size"),
        ("metrics.address", "localhost", "HOST:PORT"),
        ("metrics.address", "localhost:", "HOST:PORT"),
        ("metrics.address", "localhost:99999", "HOST:PORT"),
        ("metrics.address", "localhost:http", "HOST:PORT"),
        ("metrics.address", "", "must not be empty"),
        ("mps.devices", "0,0", "twice"),
        ("mps.devices", "gpu0", "GPU indices"),
        ("node.log-level", "loud", "one of debug, info, warning, error"),
        ("kube.pause-components", "Dcgm", "NAME=KEY=VALUE"),
        ("kube.restart-pods", "app", "key=value"),
    ],
)
def test_bad_flag_is_one_readable_sentence(dotted: str, value: str, words: str) -> None:
    spec = BY_KEY[dotted]
    message = load_error(flags={spec.dest: [value] if spec.repeat else value})
    assert message.startswith(f"{spec.flag}: ")
    assert words in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("dotted", "value", "expected"),
    [
        ("metrics.gpm-interval", "0.1", 0.1),
        ("mps.replicas", "2", 2),
        ("mps.thread-percentage", "1", 1),
        ("mps.thread-percentage", "100", 100),
        ("mps.thread-percentage", "", None),
        ("mps.pinned-memory", "2G", "2G"),
        ("mps.pinned-memory", "0=2G,1=4G", "0=2G,1=4G"),
        ("mps.pinned-memory", "512MiB", "512MiB"),
        ("metrics.address", "127.0.0.1:9500", "127.0.0.1:9500"),
        ("metrics.address", "[::1]:9401", "[::1]:9401"),
        ("metrics.address", ":9401", ":9401"),
        ("mps.devices", "0,1", (0, 1)),
        ("mps.devices", "", None),
        ("node.log-level", "DEBUG", "debug"),
        ("kube.pod-resources-socket", "", None),
    ],
)
def test_good_flag_is_taken(dotted: str, value: str, expected: Any) -> None:
    spec = BY_KEY[dotted]
    assert value_of(load(flags={spec.dest: value})[0], spec) == expected


@pytest.mark.parametrize(
    ("yaml_value", "expected"),
    [
        ("{0: 2G}", "0=2G"),
        ("{0: 2G, 1: 4G}", "0=2G,1=4G"),
        ("'0=2G,1=4G'", "0=2G,1=4G"),
        ("2G", "2G"),
        ("null", None),
    ],
)
def test_pinned_memory_in_the_file(tmp_path: Path, yaml_value: str, expected: str | None) -> None:
    file, _ = one_setting_file(tmp_path, BY_KEY["mps.pinned-memory"], yaml_value)
    assert load(file=file)[0].mps.pinned_memory == expected


@pytest.mark.parametrize(
    ("yaml_value", "words"),
    [("{a: 2G}", "GPU indices"), ("{0: 2X}", "'2X' is not a size"), ("{}", "must not be empty")],
)
def test_bad_pinned_memory_in_the_file(tmp_path: Path, yaml_value: str, words: str) -> None:
    file, where = one_setting_file(tmp_path, BY_KEY["mps.pinned-memory"], yaml_value)
    message = load_error(file=file)
    assert message.startswith(f"{where}: mps.pinned-memory: ") and words in message


# -- every error at once -------------------------------------------------------------------


def test_errors_of_every_source_come_together(tmp_path: Path) -> None:
    file = settings_file(
        tmp_path,
        "version: nodeagent/v1\nreconcile:\n  interval: -1\nmetrics:\n  colour: blue\n",
    )
    message = load_error(
        flags=flags(**{"metrics.refresh-interval": "nan", "mps.thread-percentage": "101"}),
        environ={"NODEAGENT_MPS_REPLICAS": "1"},
        file=file,
    )
    first, *lines = message.split("\n")
    assert first == "5 settings errors:"
    assert {line.strip().split(": ")[0] for line in lines} == {
        f"{file}:5:3",
        f"{file}:3:13",
        "--refresh-interval",
        "environment variable NODEAGENT_MPS_REPLICAS",
        "--mps-thread-percentage",
    }


def test_many_errors_are_capped_with_a_count(tmp_path: Path) -> None:
    unknown = "".join(f"  key{i}: 1\n" for i in range(MAX_ERRORS + 4))
    file = settings_file(tmp_path, f"version: nodeagent/v1\nmetrics:\n{unknown}")
    message = load_error(file=file, flags=flags(**{"mps.replicas": "1"}))
    first, *lines = message.split("\n")
    assert first == f"{MAX_ERRORS + 5} settings errors:"
    assert len(lines) == MAX_ERRORS + 1
    assert all("unknown key 'metrics.key" in line for line in lines[:MAX_ERRORS])
    assert lines[-1] == "  ... and 5 more"


# -- the settings file is strict -------------------------------------------------------------

V1 = "version: nodeagent/v1\n"


@pytest.mark.parametrize(
    ("body", "position", "words"),
    [
        pytest.param("version: nodeagent/v2\n", "1:10", "version must be 'nodeagent/v1', not 'nodeagent/v2'", id="wrong-version"),
        pytest.param("version: v1\n", "1:10", "version must be 'nodeagent/v1'", id="mig-parted-version"),
        pytest.param("version: 1\n", "1:10", "version must be 'nodeagent/v1'", id="number-version"),
        pytest.param("metrics:\n  refresh-interval: 1\n", None, "version: nodeagent/v1", id="no-version"),
        pytest.param(V1 + "metric:\n  refresh-interval: 1\n", "2:1", "unknown key 'metric' (known: version, node, metrics, reconcile, mig, labels, mps, kube, sharing, dra)", id="unknown-group"),
        pytest.param(V1 + "metrics:\n  refresh_interval: 1\n", "3:3", "unknown key 'metrics.refresh_interval' (known in metrics: address, refresh-interval, gpm-interval, web-config-file, health-details, dcgm-compat)", id="unknown-key"),
        pytest.param(V1 + "mps:\n  replicas: 2\n  replicas: 3\n", "4:3", "mps.replicas given twice", id="key-twice"),
        pytest.param(V1 + "metrics: 5\n", "2:10", "metrics must be a mapping", id="group-scalar"),
        pytest.param(V1 + "metrics: [refresh-interval]\n", "2:10", "metrics must be a mapping", id="group-list"),
        pytest.param(V1 + "metrics:\n", "2:9", "metrics must be a mapping", id="group-empty"),
        pytest.param(V1 + "metrics: {refresh-interval: [1\n", "3:1", "not valid YAML", id="unclosed-flow"),
        pytest.param(V1 + "metrics:\n\trefresh-interval: 1\n", "3:1", "not valid YAML", id="tab-indent"),
        pytest.param(V1 + "metrics:\n  refresh-interval: !custom 1\n", "3:21", "'!custom'", id="unknown-tag"),
        pytest.param("", None, "must be a mapping with version: nodeagent/v1", id="empty-file"),
        pytest.param("# only a comment\n", None, "must be a mapping with version", id="only-comment"),
        pytest.param("nodeagent/v1\n", None, "must be a mapping with version", id="scalar-file"),
        pytest.param("- version: nodeagent/v1\n", None, "must be a mapping with version", id="list-file"),
    ],
)  # fmt: skip
def test_bad_settings_file_is_one_config_error(
    tmp_path: Path, body: str, position: str | None, words: str
) -> None:
    file = settings_file(tmp_path, body)
    message = load_error(file=file)
    assert message.startswith(f"{file}:{position}: " if position else f"{file}: ")
    assert words in message


@pytest.mark.parametrize("group", sorted({s.group for s in SPECS}))
def test_unknown_key_lists_every_known_key_of_its_group(tmp_path: Path, group: str) -> None:
    message = load_error(file=settings_file(tmp_path, f"{V1}{group}:\n  nonsense: 1\n"))
    listed = message.split(f"(known in {group}: ")[1].rstrip(")").split(", ")
    assert listed == [s.key for s in SPECS if s.group == group]


def test_group_given_twice_is_refused(tmp_path: Path) -> None:
    file = settings_file(
        tmp_path, V1 + "metrics:\n  refresh-interval: 1\nmetrics:\n  gpm-interval: 2\n"
    )
    message = load_error(file=file)
    assert message.startswith(f"{file}:4:1: ") and "metrics" in message


@pytest.mark.parametrize(
    "body",
    [V1 + "metrics: !custom\n  refresh-interval: 1\n", "version: !custom nodeagent/v1\n"],
    ids=["on-group", "on-version"],
)
def test_unknown_tag_anywhere_is_refused(tmp_path: Path, body: str) -> None:
    assert "!custom" in load_error(file=settings_file(tmp_path, body))


@pytest.mark.parametrize(
    "body",
    [
        b"version: nodeagent/v1\nnode:\n  simulate: caf\xe9\n",  # Latin-1
        "version: nodeagent/v1\n".encode("utf-16"),
        b"\xff\xfe\x00",
    ],
    ids=["latin-1", "utf-16", "garbage"],
)
def test_file_that_is_not_utf8_is_one_sentence(tmp_path: Path, body: bytes) -> None:
    file = settings_file(tmp_path, body)
    message = load_error(file=file)
    assert message.startswith(f"{file}: not UTF-8 text")
    assert "\n" not in message


def test_utf8_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    file = settings_file(tmp_path, "\ufeffversion: nodeagent/v1\nnode: {simulate: h200}\n")
    assert load(file=file)[0].node.simulate == "h200"


def _nested(shape: str, depth: int) -> str:
    if shape == "lists":
        return "[" * depth + "]" * depth
    return "{a: " * depth + "1" + "}" * depth


@pytest.mark.parametrize(
    ("loader", "shape", "where"),
    [
        ("libyaml", "lists", "root"),
        ("libyaml", "lists", "value"),
        ("libyaml", "mappings", "root"),
        ("libyaml", "mappings", "value"),
        # Without libyaml the composer recurses in Python. (2000 nested lists take PyYAML's
        # pure-Python scanner 0.6 s: mappings show the same RecursionError faster.)
        ("pure-python", "mappings", "root"),
        ("pure-python", "mappings", "value"),
    ],
)
def test_deeply_nested_file_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loader: str, shape: str, where: str
) -> None:
    if loader == "pure-python":
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    elif not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML is built without libyaml")
    deep = _nested(shape, 2000)
    body = deep if where == "root" else f"{V1}metrics:\n  refresh-interval: {deep}\n"
    file = settings_file(tmp_path, body)
    assert load_error(file=file).startswith(file)


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_settings_file_names_the_path(tmp_path: Path, what: str) -> None:
    file = str(tmp_path / "absent.yaml") if what == "missing" else str(tmp_path)
    message = load_error(file=file)
    assert message.startswith(f"cannot read settings file {file}: ")
    assert "\n" not in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_settings_file_without_read_permission(tmp_path: Path) -> None:
    file = settings_file(tmp_path, V1)
    Path(file).chmod(0)
    assert load_error(file=file) == f"cannot read settings file {file}: Permission denied"


# -- the environment is read for the groups a command uses -------------------------------------


def test_environment_of_other_groups_is_not_parsed() -> None:
    settings, _ = load(environ={"NODEAGENT_MPS_REPLICAS": "abc"}, groups=["node"])
    assert settings.mps.replicas == 2


def test_environment_of_a_used_group_is_parsed() -> None:
    message = load_error(environ={"NODEAGENT_MPS_REPLICAS": "abc"}, groups=["node", "mps"])
    assert message == (
        "environment variable NODEAGENT_MPS_REPLICAS: must be a whole number, not 'abc'"
    )


@pytest.mark.parametrize(
    ("argv", "fails"),
    [
        (["status"], False),
        (["labels"], True),  # -f/-c: checked as `sharing apply` checks it, MPS settings too
        (["mig", "export"], False),
        (["mps", "status"], True),
        (["run"], True),
        (["config", "check"], True),
    ],
)
def test_commands_read_only_the_variables_they_use(argv: list[str], fails: bool) -> None:
    environ = {"NODEAGENT_MPS_REPLICAS": "abc"}
    if fails:
        with pytest.raises(ConfigError, match="NODEAGENT_MPS_REPLICAS"):
            load_cli(argv, environ)
    else:
        assert load_cli(argv, environ).mps.replicas == 2


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["mps", "--help"]])
def test_help_does_not_read_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    monkeypatch.setenv("NODEAGENT_MPS_REPLICAS", "abc")
    monkeypatch.setenv("NODEAGENT_REFRESH_INTERVAL", "nan")
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 0
    assert "usage: nodeagent" in capsys.readouterr().out


# -- settings checked together ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "environ", "words"),
    [
        (["run", "--kube"], {}, "--kube needs the node's name"),
        (["run", "--kube", "--node-name", "n1", "-f", "m.yaml", "-c", "all-1g"], {}, "drop -c"),
        (["run", "--kube", "-c", "all-1g"], {"NODE_NAME": "n1"}, "drop -c"),
        (["run", "-c", "all-1g"], {}, "needs both the file and the name (-f and -c)"),
        (["run", "--mps", "--mps-devices", "0", "--mps-pinned-memory", "1=2G"], {}, "GPU 1, which is not in mps.devices"),
    ],
)  # fmt: skip
def test_settings_that_do_not_fit_together(
    argv: list[str], environ: dict[str, str], words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_cli(argv, environ)
    assert words in str(err.value)


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["run", "--kube", "--node-name", "n1", "-f", "m.yaml"], {}),
        (["run", "--kube"], {"NODE_NAME": "n1"}),
        (["run", "-f", "m.yaml", "-c", "all-1g"], {}),
        (["run", "--mps", "--mps-devices", "0,1", "--mps-pinned-memory", "1=2G"], {}),
        (["mig", "apply", "-c", "all-1g"], {}),  # the file check is run's; apply says so itself
    ],
)
def test_settings_that_fit_together(argv: list[str], environ: dict[str, str]) -> None:
    load_cli(argv, environ)


# -- reload ------------------------------------------------------------------------------------


def _loaded(**by_dotted: str) -> Settings:
    return load(flags(**by_dotted))[0]


@pytest.mark.parametrize(
    ("changes", "refused"),
    [
        ({}, []),
        ({"metrics.refresh-interval": "1"}, []),
        ({"node.log-level": "debug", "mig.config": "all-1g", "mig.config-file": "m.yaml"}, []),
        ({"mps.replicas": "4", "mps.pinned-memory": "0=2G"}, []),
        ({"kube.pause-components": ["dcgm=app=dcgm"], "kube.restart-pods": ["app=x"]}, []),
        ({"metrics.address": "127.0.0.1:9500"}, ["metrics.address"]),
        ({"kube.node-name": "n2"}, ["kube.node-name"]),
        ({"mps.pipe-dir": "/tmp/pipe"}, ["mps.pipe-dir"]),
        ({"kube.enabled": "true", "kube.node-name": "n2"}, ["kube.enabled", "kube.node-name"]),
        ({"node.run-dir": "/tmp/run", "node.simulate": "h200"}, ["node.simulate", "node.run-dir"]),
        (
            {"metrics.address": "127.0.0.1:9500", "metrics.refresh-interval": "1"},
            ["metrics.address"],
        ),
    ],
)
def test_reload_takes_hot_settings_and_refuses_the_others(
    changes: dict[str, Any], refused: list[str]
) -> None:
    old = _loaded()
    new = _loaded(**changes)
    merged, got_refused = merge_reload(old, new)
    assert got_refused == refused
    for dotted in changes:
        spec = BY_KEY[dotted]
        expected = value_of(old if dotted in refused else new, spec)
        assert value_of(merged, spec) == expected
    if not changes:
        assert merged == old


def test_reload_keeps_what_was_not_changed() -> None:
    old = _loaded(**{"metrics.refresh-interval": "2", "kube.node-name": "n1"})
    new = _loaded(**{"metrics.refresh-interval": "2", "kube.node-name": "n1", "mps.replicas": "3"})
    merged, refused = merge_reload(old, new)
    assert refused == []
    assert merged == dataclasses.replace(old, mps=dataclasses.replace(old.mps, replicas=3))


# -- the effective settings, written back as a file ----------------------------------------------

NON_DEFAULT = [
    "--simulate", "h200x2", "--sim-state", "/tmp/sim.json", "--log-level", "debug",
    "run", "--refresh-interval", "0.5", "--gpm-interval", "0.1", "--lock-timeout", "0",
    "-f", "/etc/nodeagent/mig.yaml", "--reset-command", "nvidia-smi -r -i {index}",
    "--label-prefix", "example.com/", "--nfd-features-file", "/etc/features.d/nodeagent",
    "--mps", "--mps-devices", "0,1", "--mps-replicas", "4", "--mps-thread-percentage", "25",
    "--mps-pinned-memory", "0=2G,1=4G", "--mps-pipe-dir", "/tmp/pipe", "--mps-exclusive-process",
    "--kube", "--node-name", "0755", "--kube-host", "null",
    "--pause-component", "dcgm=app=dcgm-exporter",
    "--pause-component", "plugin=app=nvidia-device-plugin,tier=yes",
    "--restart-pods", "app=true", "--restart-pods", "app=b,tier=c",
    "--pod-resources-socket", "",
]  # fmt: skip


@pytest.mark.parametrize("argv", [["run"], NON_DEFAULT], ids=["defaults", "non-default"])
def test_effective_settings_load_back_the_same(tmp_path: Path, argv: list[str]) -> None:
    original = load_cli(argv)
    file = settings_file(tmp_path, yaml.safe_dump(as_document(original), sort_keys=False))
    again, sources = load(file=file)
    assert dataclasses.replace(again, file=None) == original
    assert {s.kind for s in sources.values()} == {"file"}


def test_non_default_mix_is_not_the_defaults() -> None:
    mixed = load_cli(NON_DEFAULT)
    assert mixed.kube.pause_components == {
        "dcgm": {"app": "dcgm-exporter"},
        "plugin": {"app": "nvidia-device-plugin", "tier": "yes"},
    }
    assert mixed.kube.restart_pods == ({"app": "true"}, {"app": "b", "tier": "c"})
    assert mixed.kube.node_name == "0755" and mixed.kube.host == "null"
    assert mixed.mps.devices == (0, 1) and mixed.mps.pinned_memory == "0=2G,1=4G"
    assert mixed.kube.pod_resources_socket is None


# -- variables with aliases -----------------------------------------------------------------------

ALIASED = [s for s in SPECS if len(s.env) > 1]


def test_aliases_are_found() -> None:
    assert {"NODE_NAME", "CUDA_MPS_PIPE_DIRECTORY"} <= {v for s in ALIASED for v in s.env[1:]}


def _two_values(spec: Spec) -> tuple[str, str]:
    """Two values `spec` parses to different settings: paths and names, or a switch's."""
    try:
        spec.parse("/from/first")
    except Invalid:
        return "true", "false"
    return "/from/first", "/from/second"


@pytest.mark.parametrize("spec", ALIASED, ids=lambda s: s.dotted)
def test_first_listed_variable_wins(spec: Spec) -> None:
    first, second = spec.env[:2]
    one, other = _two_values(spec)
    settings, sources = load(environ={second: other, first: one})
    assert value_of(settings, spec) == spec.parse(one) != spec.parse(other)
    assert sources[spec.dotted] == Source("env", first)


@pytest.mark.parametrize("spec", ALIASED, ids=lambda s: s.dotted)
def test_alias_alone_works(spec: Spec) -> None:
    value = _two_values(spec)[0]
    settings, sources = load(environ={spec.env[-1]: value})
    assert value_of(settings, spec) == spec.parse(value)
    assert sources[spec.dotted] == Source("env", spec.env[-1])


@pytest.mark.parametrize(
    ("environ", "argv", "expected"),
    [
        ({"NODE_NAME": "a"}, [], "a"),
        ({"NODEAGENT_NODE_NAME": "b"}, [], "b"),
        ({"NODE_NAME": "a", "NODEAGENT_NODE_NAME": "b"}, [], "b"),
        ({"NODE_NAME": "a", "NODEAGENT_NODE_NAME": "b"}, ["--node-name", "c"], "c"),
    ],
)
def test_node_name(environ: dict[str, str], argv: list[str], expected: str) -> None:
    assert load_cli(["run", "--kube", *argv], environ).kube.node_name == expected


def test_cuda_mps_pipe_directory() -> None:
    settings = load_cli(["mps", "status"], {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps-pipe"})
    assert settings.mps.pipe_dir == Path("/tmp/mps-pipe")


# -- repeatable flags -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--pause-component", "dcgm=app=dcgm", "--pause-component", "dp=app=dp,tier=gpu"], {},
         {"dcgm": {"app": "dcgm"}, "dp": {"app": "dp", "tier": "gpu"}}),
        ([], {"NODEAGENT_PAUSE_COMPONENTS": "dcgm=app=dcgm;dp=app=dp"},
         {"dcgm": {"app": "dcgm"}, "dp": {"app": "dp"}}),
        (["--pause-component", "dp=app=dp"], {"NODEAGENT_PAUSE_COMPONENTS": "dcgm=app=dcgm"},
         {"dp": {"app": "dp"}}),
        # mig-manager's set by default; '' pauses nothing; a NAME alone waits only for the
        # DaemonSet pods selecting its label.
        ([], {}, {n: {} for n in DEFAULT_PAUSE_COMPONENTS}),
        ([], {"NODEAGENT_PAUSE_COMPONENTS": ""}, {}),
        (["--pause-component", "nvsm", "--pause-component", "dp=app=dp"], {},
         {"nvsm": {}, "dp": {"app": "dp"}}),
    ],
)  # fmt: skip
def test_pause_component_flags(
    argv: list[str], environ: dict[str, str], expected: dict[str, dict[str, str]]
) -> None:
    assert load_cli(["run", *argv], environ).kube.pause_components == expected


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["--restart-pods", "app=a", "--restart-pods", "app=b,tier=c"], {},
         ({"app": "a"}, {"app": "b", "tier": "c"})),
        ([], {"NODEAGENT_RESTART_PODS": "app=a;app=b"}, ({"app": "a"}, {"app": "b"})),
        ([], {}, ()),
    ],
)  # fmt: skip
def test_restart_pods_flags(
    argv: list[str], environ: dict[str, str], expected: tuple[dict[str, str], ...]
) -> None:
    assert load_cli(["run", *argv], environ).kube.restart_pods == expected
