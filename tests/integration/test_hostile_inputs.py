"""Bad input never escapes: one row per hostile input, through every channel a user or a file
has (MIG config files, stdin, settings files, environment variables, flags of every command,
kubeconfig, MPS settings, label prefix, metrics address). Every row ends in its documented exit
code and one readable sentence naming the problem, no traceback, and the emulated node (a state
file) unchanged. The emulator's own inputs and the HTTP endpoint have their corpora in
tests/integration/sim/test_hostile_sim.py and tests/integration/metrics/test_endpoint_hostile.py.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.base.errors import ConfigError
from nodeagent.mig.config import parse_config
from tests.support.cli import Result

ENV_AT_IMPORT = {k: v for k, v in os.environ.items() if k.startswith("NODEAGENT_")}

GOOD_MIG = """version: v1
mig-configs:
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
  off:
    - devices: all
      mig-enabled: false
"""
RANDOM = random.Random(7).randbytes(4096)
FIFO = b"<fifo>"  # as a file's content: make a FIFO there (no process writes it)


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    code: int
    words: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)  # name -> content, under tmp
    env: dict[str, str] = field(default_factory=dict)
    stdin: str | None = None
    multi: bool = False  # several problems: the first line counts them, one per line after


def mig(body: bytes | str) -> dict[str, bytes]:
    return {"mig.yaml": body.encode() if isinstance(body, str) else body}


def settings_file(body: str) -> dict[str, bytes]:
    return {"na.yaml": ("version: nodeagent/v1\n" + body).encode()}


APPLY = ("mig", "apply", "-f", "{tmp}/mig.yaml", "-c", "all-balanced")
RUN = ("run", "--metrics-address", "127.0.0.1:0")
CHECK = ("config", "check", "--config", "{tmp}/na.yaml")
MPS = ("mps", "status", "--mps-control", "/nonexistent/mps-control", "--mps-pipe-dir", "{tmp}/p")
DEEP = "version: v1\nmig-configs:\n  a: " + "[" * 3000 + "]" * 3000 + "\n"
ALIASES = (
    "version: v1\nmig-configs:\n  bad: &bad\n    - devices: nope\n      mig-enabled: maybe\n"
    + "".join(f"  c{i}: *bad\n" for i in range(5000))
)

CASES: dict[str, Case] = {
    # -- MIG config files -----------------------------------------------------------------
    "mig-random-bytes": Case(APPLY, 2, ("not UTF-8",), mig(RANDOM)),
    "mig-latin1-comment": Case(
        APPLY, 2, ("not UTF-8", "offset 5"), mig(b"# caf\xe9\n" + GOOD_MIG.encode())
    ),
    "mig-utf16": Case(APPLY, 2, ("not UTF-8",), mig(GOOD_MIG.encode("utf-16"))),
    "mig-nul-bytes": Case(APPLY, 2, ("not valid YAML",), mig(b"version: v1\x00\n")),
    "mig-empty": Case(APPLY, 2, ("the file is empty",), mig(b"")),
    "mig-only-comment": Case(APPLY, 2, ("the file is empty",), mig(b"# nothing\n")),
    "mig-scalar": Case(APPLY, 2, ("must be a mapping",), mig("hello\n")),
    "mig-list": Case(APPLY, 2, ("must be a mapping",), mig("- a\n- b\n")),
    "mig-nested-3000": Case(APPLY, 2, ("not valid YAML",), mig(DEEP)),
    "mig-unknown-tag": Case(
        APPLY,
        2,
        ("mig.yaml:1:10", "'!custom'"),
        mig("version: !custom v1\n" + GOOD_MIG.split("\n", 1)[1]),
    ),
    "mig-bad-int-tag": Case(
        APPLY,
        2,
        ("'abc' is not a valid int",),
        mig(
            GOOD_MIG.replace(
                "devices: all\n      mig-enabled: true",
                "devices: !!int abc\n      mig-enabled: true",
            )
        ),
        multi=True,
    ),
    "mig-bad-timestamp": Case(
        APPLY,
        2,
        ("'2001-99-99' is not a valid timestamp",),
        mig(GOOD_MIG.replace("mig-enabled: false", "mig-enabled: !!timestamp 2001-99-99")),
        multi=True,
    ),
    "mig-python-tag": Case(
        APPLY,
        2,
        ("python/object:os.system",),
        mig(GOOD_MIG.replace("mig-enabled: false", "mig-enabled: !!python/object:os.system x")),
        multi=True,
    ),
    "mig-5000-aliases": Case(APPLY, 2, ("errors:", "... and"), mig(ALIASES), multi=True),
    "mig-tab-indent": Case(
        APPLY, 2, ("not valid YAML",), mig("version: v1\nmig-configs:\n\tall: []\n")
    ),
    "mig-unclosed-quote": Case(APPLY, 2, ("not valid YAML",), mig('version: "v1\n')),
    "mig-duplicate-key": Case(
        APPLY,
        2,
        ("twice",),
        mig(GOOD_MIG + "  off:\n    - devices: all\n      mig-enabled: false\n"),
    ),
    "mig-version-v2": Case(APPLY, 2, ("version must be v1",), mig(GOOD_MIG.replace("v1", "v2", 1))),
    "mig-unknown-profile": Case(
        APPLY, 2, ("9g.99gb",), mig(GOOD_MIG.replace('"3g.71gb": 1', '"9g.99gb": 1'))
    ),
    "mig-negative-count": Case(
        APPLY, 2, ("-1",), mig(GOOD_MIG.replace('"3g.71gb": 1', '"3g.71gb": -1'))
    ),
    "mig-huge-count": Case(
        APPLY,
        2,
        ("3g.71gb",),
        mig(GOOD_MIG.replace('"3g.71gb": 1', '"3g.71gb": 99999999999999999999')),
    ),
    "mig-float-count": Case(
        APPLY, 2, ("3g.71gb",), mig(GOOD_MIG.replace('"3g.71gb": 1', '"3g.71gb": 1.5'))
    ),
    "mig-device-index-huge": Case(  # skipped as mig-parted does: then nothing matches
        APPLY,
        1,
        ("99",),
        mig(
            GOOD_MIG.replace(
                "devices: all\n      mig-enabled: true", "devices: [99]\n      mig-enabled: true"
            )
        ),
    ),
    "mig-bad-filter": Case(
        APPLY,
        2,
        ("device-filter",),
        mig(
            GOOD_MIG.replace(
                "devices: all\n      mig-enabled: true",
                'devices: all\n      device-filter: "0xZZ"\n      mig-enabled: true',
            )
        ),
    ),
    "mig-no-such-config": Case(
        ("mig", "apply", "-f", "{tmp}/mig.yaml", "-c", "nope"),
        2,
        ("no config named 'nope'", "all-balanced"),
        mig(GOOD_MIG),
    ),
    "mig-no-name": Case(
        ("mig", "apply", "-f", "{tmp}/mig.yaml"), 2, ("no config name",), mig(GOOD_MIG)
    ),
    "mig-missing-file": Case(APPLY, 2, ("cannot read MIG config file", "No such file"), {}),
    "mig-directory": Case(
        ("mig", "apply", "-f", "{tmp}", "-c", "a"), 2, ("cannot read MIG config file",)
    ),
    "mig-assert-bad-bytes": Case(
        ("mig", "assert", "-f", "{tmp}/mig.yaml", "-c", "a"), 2, ("not UTF-8",), mig(RANDOM)
    ),
    # No -f: -c names a config generated from the GPUs; with neither there is nothing to apply.
    "mig-no-file-no-name": Case(("mig", "apply"), 2, ("no MIG config", "-c NAME")),
    "mig-no-file-unknown-name": Case(
        ("mig", "apply", "-c", "all-9g"), 2, ("generated from this node's GPUs", "all-9g")
    ),
    # -- stdin --------------------------------------------------------------------------------
    "stdin-empty": Case(("mig", "apply", "-f", "-", "-c", "a"), 2, ("<stdin>", "empty"), stdin=""),
    "stdin-garbage": Case(("mig", "apply", "-f", "-", "-c", "a"), 2, ("<stdin>",), stdin="{{{{"),
    "stdin-json-array": Case(
        ("mig", "apply", "-f", "-", "-c", "a"), 2, ("must be a mapping",), stdin="[1, 2, 3]"
    ),
    # -- the settings file ------------------------------------------------------------------------
    "settings-missing": Case(CHECK, 2, ("cannot read settings file",)),
    "settings-binary": Case(CHECK, 2, ("not UTF-8",), {"na.yaml": RANDOM}),
    "settings-no-version": Case(
        CHECK, 2, ("version",), {"na.yaml": b"metrics: {refresh-interval: 2}\n"}
    ),
    "settings-wrong-version": Case(
        CHECK, 2, ("version must be 'nodeagent/v1'",), {"na.yaml": b"version: v1\n"}
    ),
    "settings-unknown-group": Case(
        CHECK, 2, ("unknown key 'metric'",), settings_file("metric: {}\n")
    ),
    "settings-unknown-key": Case(
        CHECK,
        2,
        ("na.yaml:3:3", "refresh-intervall"),
        settings_file("metrics:\n  refresh-intervall: 2\n"),
    ),
    "settings-nan": Case(
        CHECK,
        2,
        ("na.yaml:2:29", "metrics.refresh-interval", "finite"),
        settings_file("metrics: {refresh-interval: .nan}\n"),
    ),
    "settings-inf": Case(CHECK, 2, ("finite",), settings_file("reconcile: {interval: .inf}\n")),
    "settings-list-for-number": Case(
        CHECK, 2, ("number of seconds",), settings_file("reconcile: {interval: [1]}\n")
    ),
    "settings-bool-for-number": Case(
        CHECK, 2, ("number of seconds",), settings_file("reconcile: {interval: true}\n")
    ),
    "settings-group-scalar": Case(CHECK, 2, ("must be a mapping",), settings_file("mps: 5\n")),
    "settings-group-twice": Case(CHECK, 2, ("given twice",), settings_file("mps: {}\nmps: {}\n")),
    "settings-tag": Case(CHECK, 2, ("!custom",), settings_file("mps: !custom {}\n")),
    "settings-deep": Case(
        CHECK, 2, ("na.yaml",), settings_file("mps: {devices: " + "[" * 3000 + "]" * 3000 + "}\n")
    ),
    "settings-bad-devices": Case(
        CHECK, 2, ("mps.devices", "GPU indices"), settings_file("mps: {devices: [a]}\n")
    ),
    "settings-bad-pause": Case(
        CHECK, 2, ("kube.pause-components",), settings_file("kube: {pause-components: [1, 2]}\n")
    ),
    "settings-two-problems": Case(
        CHECK,
        2,
        ("2 settings errors",),
        settings_file("metrics: {refresh-interval: 0}\nreconcile: {interval: -1}\n"),
        multi=True,
    ),
    "settings-env-names-file": Case(
        ("config", "check"),
        2,
        ("cannot read settings file",),
        env={"NODEAGENT_CONFIG": "/nonexistent.yaml"},
    ),
    # -- environment variables ----------------------------------------------------------------------
    "env-refresh-nan": Case(
        RUN, 2, ("NODEAGENT_REFRESH_INTERVAL", "finite"), env={"NODEAGENT_REFRESH_INTERVAL": "nan"}
    ),
    "env-replicas-abc": Case(
        MPS, 2, ("NODEAGENT_MPS_REPLICAS", "whole number"), env={"NODEAGENT_MPS_REPLICAS": "abc"}
    ),
    "env-devices": Case(
        MPS, 2, ("NODEAGENT_MPS_DEVICES", "GPU indices"), env={"NODEAGENT_MPS_DEVICES": "0,x"}
    ),
    "env-kube-bool": Case(
        RUN, 2, ("NODEAGENT_KUBE", "true or false"), env={"NODEAGENT_KUBE": "perhaps"}
    ),
    "env-log-level": Case(
        ("--simulate", "h200", "status"),
        2,
        ("NODEAGENT_LOG_LEVEL", "one of"),
        env={"NODEAGENT_LOG_LEVEL": "loud"},
    ),
    "env-simulate-empty-model": Case(
        ("status",), 2, ("simulate",), env={"NODEAGENT_SIMULATE": "nonsense-gpu"}
    ),
    "env-metrics-address": Case(
        RUN[:1],
        2,
        ("NODEAGENT_METRICS_ADDRESS", "HOST:PORT"),
        env={"NODEAGENT_METRICS_ADDRESS": "nowhere"},
    ),
    "env-label-prefix": Case(
        ("labels",),
        2,
        ("NODEAGENT_LABEL_PREFIX", "DNS subdomain"),
        env={"NODEAGENT_LABEL_PREFIX": "bad prefix!/"},
    ),
    "env-lock-timeout": Case(
        APPLY,
        2,
        ("NODEAGENT_MIG_LOCK_TIMEOUT",),
        mig(GOOD_MIG),
        env={"NODEAGENT_MIG_LOCK_TIMEOUT": "-5"},
    ),
    "env-pause": Case(
        RUN,
        2,
        ("NODEAGENT_PAUSE_COMPONENTS", "NAME=KEY=VALUE"),
        env={"NODEAGENT_PAUSE_COMPONENTS": "just a name"},
    ),
    "env-superscript-devices": Case(
        MPS, 2, ("NODEAGENT_MPS_DEVICES", "GPU indices"), env={"NODEAGENT_MPS_DEVICES": "\u00b2"}
    ),
    "env-superscript-port": Case(
        RUN[:1], 2, ("NODEAGENT_METRICS_ADDRESS",), env={"NODEAGENT_METRICS_ADDRESS": ":\u00b2"}
    ),
    "env-superscript-pinned": Case(
        MPS, 2, ("NODEAGENT_MPS_PINNED_MEMORY",), env={"NODEAGENT_MPS_PINNED_MEMORY": "\u00b2=2G"}
    ),
    "env-arabic-digit-replicas": Case(
        MPS, 2, ("whole number",), env={"NODEAGENT_MPS_REPLICAS": "\u0663"}
    ),
    "env-underscore-replicas": Case(
        MPS, 2, ("whole number",), env={"NODEAGENT_MPS_REPLICAS": "1_000"}
    ),
    # -- flags -------------------------------------------------------------------------------------------
    "flag-unknown": Case(
        ("--simulate", "h200", "status", "--frobnicate"), 2, ("unrecognized arguments",)
    ),
    "flag-no-command": Case(("--simulate", "h200"), 2, ("required",)),
    "flag-bad-output": Case(("--simulate", "h200", "status", "-o", "xml"), 2, ("invalid choice",)),
    "flag-refresh-zero": Case((*RUN, "--refresh-interval", "0"), 2, ("--refresh-interval", "> 0")),
    "flag-refresh-negative": Case((*RUN, "--refresh-interval", "-3"), 2, ("--refresh-interval",)),
    "flag-gpm-tiny": Case((*RUN, "--gpm-interval", "0.001"), 2, ("--gpm-interval", "at least 0.1")),
    "flag-reconcile-inf": Case(
        (*RUN, "--reconcile-interval", "inf"), 2, ("--reconcile-interval", "finite")
    ),
    "flag-watch-nan": Case((*RUN, "--watch-timeout", "nan"), 2, ("--watch-timeout", "finite")),
    "flag-watch-huge": Case((*RUN, "--watch-timeout", "1e308"), 2, ("--watch-timeout", "at most")),
    "flag-refresh-tiny": Case(
        (*RUN, "--refresh-interval", "1e-9"), 2, ("--refresh-interval", "at least 0.01")
    ),
    "flag-clients-wait-text": Case(
        (*RUN, "--clients-wait-seconds", "soon"), 2, ("--clients-wait-seconds",)
    ),
    "flag-kube-no-node": Case((*RUN, "--kube"), 2, ("NODE_NAME",)),
    "flag-restart-pods-bad": Case(
        (*RUN, "--restart-pods", "app"), 2, ("--restart-pods", "key=value")
    ),
    "flag-address-port-range": Case(
        ("run", "--metrics-address", "127.0.0.1:99999"), 2, ("HOST:PORT",)
    ),
    "flag-label-prefix-no-slash": Case(
        ("labels", "--label-prefix", "foo"), 2, ("--label-prefix", "DNS subdomain")
    ),
    "flag-label-prefix-upper": Case(
        ("labels", "--label-prefix", "NVIDIA.com/"), 2, ("--label-prefix",)
    ),
    "flag-label-prefix-long": Case(
        ("labels", "--label-prefix", "a" * 300 + ".com/"), 2, ("--label-prefix",)
    ),
    "flag-reset-command-quote": Case(
        (*APPLY, "--reset-command", "nvidia-smi 'oops"), 2, ("reset",), mig(GOOD_MIG)
    ),
    "flag-lock-timeout-nan": Case(
        (*APPLY, "--lock-timeout", "nan"), 2, ("--lock-timeout", "finite"), mig(GOOD_MIG)
    ),
    "flag-sim-attach-load": Case(
        ("sim", "attach", "--device", "0", "--pid", "5", "--load", "nan"), 2, ("--load",)
    ),
    "flag-sim-attach-pid": Case(("sim", "attach", "--device", "0", "--pid", "0"), 2, ("--pid",)),
    # -- MPS settings ------------------------------------------------------------------------------------
    "mps-pinned-1k": Case(
        (*MPS, "--mps-pinned-memory", "1K"), 2, ("--mps-pinned-memory", "under 1 MiB")
    ),
    "mps-pinned-1b": Case(
        (*MPS, "--mps-pinned-memory", "1b"), 2, ("--mps-pinned-memory", "under 1 MiB")
    ),
    "mps-pinned-twice": Case((*MPS, "--mps-pinned-memory", "0=2G,0=4G"), 2, ("twice",)),
    "mps-pinned-empty-size": Case(
        (*MPS, "--mps-pinned-memory", "0="), 2, ("--mps-pinned-memory", "not a size")
    ),
    "mps-pinned-mixed": Case(
        (*MPS, "--mps-pinned-memory", "2G,1=4G"), 2, ("--mps-pinned-memory", "INDEX=SIZE")
    ),
    "mps-pinned-unit": Case((*MPS, "--mps-pinned-memory", "2X"), 2, ("not a size",)),
    "mps-replicas-one": Case((*MPS, "--mps-replicas", "1"), 2, ("--mps-replicas", ">= 2")),
    "mps-replicas-huge": Case(
        (
            "mps",
            "start",
            "--mps-replicas",
            "100000",
            "--mps-pipe-dir",
            "{tmp}/p",
            "--mps-control",
            "/nonexistent",
        ),
        2,
        ("0 %", "100 replicas"),
    ),
    "mps-replicas-billion-default-pinned": Case(
        (
            *MPS[:1],
            "start",
            *MPS[2:],
            "--mps-replicas",
            "1000000000",
            "--mps-thread-percentage",
            "10",
        ),
        2,
        ("(its memory / 1000000000 replicas: 150 bytes)", "under 1 MiB"),
    ),
    "mps-plugin-config-replicas-huge": Case(
        (*MPS, "--mps-device-plugin-config", "{tmp}/dp.yaml", "--mps-layout", "device-plugin"),
        2,
        ("dp.yaml", "replicas must be at most 48"),
        {
            "dp.yaml": b"version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: "
            + b"9" * 70
            + b"}]}}\n"
        },
    ),
    "mps-plugin-config-fifo-without-writer": Case(
        (*MPS, "--mps-device-plugin-config", "{tmp}/fifo", "--mps-layout", "device-plugin"),
        2,
        ("device plugin config", "it is a FIFO, not a file"),
        {"fifo": FIFO},
    ),
    "mps-plugin-config-dev-zero": Case(
        (*MPS, "--mps-device-plugin-config", "/dev/zero", "--mps-layout", "device-plugin"),
        2,
        ("cannot read device plugin config /dev/zero: it is a character device, not a file",),
    ),
    "mps-thread-zero": Case(
        (*MPS, "--mps-thread-percentage", "0"), 2, ("--mps-thread-percentage", "1-100")
    ),
    "mps-devices-abc": Case((*MPS, "--mps-devices", "abc"), 2, ("--mps-devices", "GPU indices")),
    "mps-devices-twice": Case((*MPS, "--mps-devices", "0,0"), 2, ("--mps-devices", "twice")),
    "mps-device-missing": Case(
        (
            "mps",
            "start",
            "--mps-devices",
            "5",
            "--mps-pipe-dir",
            "{tmp}/p",
            "--mps-control",
            "/nonexistent",
        ),
        2,
        ("GPU 5 does not exist",),
    ),
    "mps-pinned-too-big": Case(
        (
            "mps",
            "start",
            "--mps-pinned-memory",
            "999G",
            "--mps-pipe-dir",
            "{tmp}/p",
            "--mps-control",
            "/nonexistent",
        ),
        2,
        ("more than",),
    ),
    "mps-stop-nothing": Case(
        ("mps", "stop", "--mps-control", "/nonexistent", "--mps-pipe-dir", "{tmp}/p"),
        1,
        ("no MPS control daemon runs", "nothing to stop"),
    ),
    "mps-status-nothing": Case(MPS, 1, ()),
    "mps-control-missing": Case(
        (
            "mps",
            "start",
            "--mps-control",
            "/nonexistent/mps-control",
            "--mps-pipe-dir",
            "{tmp}/p",
            "--mps-log-dir",
            "{tmp}/l",
            "--mps-ready-file",
            "{tmp}/ready",
        ),
        3,
        ("nvidia-cuda-mps-control not found at /nonexistent/mps-control",),
    ),
    "mps-pipe-under-file": Case(
        (
            "mps",
            "start",
            "--mps-control",
            "/bin/true",
            "--mps-pipe-dir",
            "{tmp}/afile/p",
            "--mps-log-dir",
            "{tmp}/l",
        ),
        3,
        ("cannot make MPS directory",),
        {"afile": b"x"},
    ),
    "settings-nul-path": Case(CHECK, 2, ("NUL",), settings_file('mig: {config-file: "a\\0b"}\n')),
    "settings-shm-size": Case(
        CHECK, 2, ("mps.shm-size", "not a size"), settings_file("mps: {shm-size: lots}\n")
    ),
    "kubeconfig-bad-tag": Case(
        (*RUN, "--kube", "--node-name", "n", "--kubeconfig", "{tmp}/kc"),
        2,
        ("kubeconfig",),
        {"kc": b"apiVersion: !!int abc\n"},
    ),
    "mps-plugin-config-tag": Case(
        (*MPS, "--mps-device-plugin-config", "{tmp}/dp.yaml", "--mps-layout", "device-plugin"),
        2,
        ("device plugin config", "cannot be read"),
        {
            "dp.yaml": b"version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: !!int abc}]}}\n"
        },
    ),
    "sharing-name-without-file": Case((*RUN, "--sharing-config", "x"), 2, ("--sharing-file",)),
    "sharing-name-with-kube": Case(
        (*RUN, "--kube", "--node-name", "n", "--sharing-file", "f", "--sharing-config", "x"),
        2,
        ("nodeagent.io/sharing.config",),
    ),
    "sharing-and-mig-name": Case(
        (*RUN, "-f", "m", "-c", "a", "--sharing-file", "f", "--sharing-config", "x"),
        2,
        ("not both",),
    ),
    "sharing-file-binary": Case(
        ("sharing", "apply", "-f", "{tmp}/s.yaml", "-c", "x"),
        2,
        ("sharing config file", "not UTF-8"),
        {"s.yaml": RANDOM},
    ),
    "sharing-file-v3": Case(
        ("sharing", "apply", "-f", "{tmp}/s.yaml", "-c", "x"),
        2,
        ("version must be nodeagent/v1",),
        {"s.yaml": b"version: nodeagent/v3\nsharing-configs: {}\n"},
        multi=True,
    ),
    "mps-pipe-dir-too-long": Case(
        ("mps", "start", "--mps-control", "/nonexistent", "--mps-pipe-dir", "/tmp/" + "p" * 120),
        2,
        ("too long for the daemon's unix", "sockets"),
    ),
    # -- names and counts that reach a terminal or a label ------------------------------------------------------
    "sharing-name-terminal-escape": Case(
        ("sharing", "apply", "-f", "{tmp}/s.yaml", "-c", "nope"),
        2,
        ("no config named 'nope'", "\\x1b[2J", "\\u2028"),
        {
            "s.yaml": b'version: nodeagent/v1\nsharing-configs:\n  "\\e[2J\\L":\n    - {devices: all, whole: {}}\n'
        },
    ),
    "mig-name-terminal-escape": Case(
        ("mig", "apply", "-f", "{tmp}/mig.yaml", "-c", "nope"),
        2,
        ("no config named 'nope'", "\\x1b]0;pwned\\x07"),
        mig(
            'version: v1\nmig-configs:\n  "\\e]0;pwned\\a":\n    - {devices: all, mig-enabled: false}\n'
        ),
    ),
    "sharing-10000-names": Case(
        ("labels", "-f", "{tmp}/s.yaml", "-c", "nope"),
        2,
        ("no config named 'nope'", "… and 9,990 more"),
        {
            "s.yaml": (
                "version: nodeagent/v1\nsharing-configs:\n"
                + "".join(f"  c{i}: [{{devices: all, whole: {{}}}}]\n" for i in range(10_000))
            ).encode()
        },
    ),
    "sharing-time-slicing-replicas-huge": Case(
        ("labels", "-f", "{tmp}/s.yaml", "-c", "c"),
        2,
        ("s.yaml:3:47", "replicas must be an integer 2-1024"),
        {
            "s.yaml": b"version: nodeagent/v1\nsharing-configs:\n  c: [{devices: all, time-slicing: {replicas: "
            + b"9" * 70
            + b"}}]\n"
        },
    ),
    "sharing-time-slicing-replicas-1025": Case(
        ("sharing", "apply", "-f", "{tmp}/s.yaml", "-c", "c"),
        2,
        ("s.yaml:3:47", "2-1024", "'1025'"),
        {
            "s.yaml": b"version: nodeagent/v1\nsharing-configs:\n  c: [{devices: all, time-slicing: {replicas: 1025}}]\n"
        },
    ),
    "sharing-mps-replicas-101": Case(
        ("labels", "-f", "{tmp}/s.yaml", "-c", "c"),
        2,
        ("s.yaml:3:38", "replicas must be an integer 2-100"),
        {
            "s.yaml": b"version: nodeagent/v1\nsharing-configs:\n  c: [{devices: all, mps: {replicas: 101}}]\n"
        },
    ),
    "workload-name-bidi": Case(
        ("plan", "-f", "{tmp}/w.yaml"),
        2,
        ("w.yaml:3:11", "no control characters"),
        {
            "w.yaml": b'version: nodeagent/v1\nworkloads:\n  - name: "a\\u202eb"\n    memory: 1G\n    isolation: shared\n'
        },
    ),
    "mig-lock-is-a-folder": Case(
        ("mig", "apply", "-f", "{tmp}/mig.yaml", "-c", "all-balanced", "--lock-timeout", "0"),
        2,
        ("MIG writer lock", "a folder, not a regular file"),
        {**mig(GOOD_MIG), ".node.json.lock/x": b""},
    ),
    # -- kubeconfig -------------------------------------------------------------------------------------------
    "kubeconfig-missing": Case(
        (*RUN, "--kube", "--node-name", "n", "--kubeconfig", "/nope"),
        2,
        ("cannot read kubeconfig /nope",),
    ),
    "kubeconfig-binary": Case(
        (*RUN, "--kube", "--node-name", "n", "--kubeconfig", "{tmp}/kc"),
        2,
        ("kubeconfig", "not UTF-8"),
        {"kc": RANDOM},
    ),
    "kubeconfig-malformed": Case(
        (*RUN, "--kube", "--node-name", "n", "--kubeconfig", "{tmp}/kc"),
        2,
        ("kubeconfig", "not valid YAML"),
        {"kc": b"apiVersion: [v1\n"},
    ),
    "kubeconfig-scalar": Case(
        (*RUN, "--kube", "--node-name", "n", "--kubeconfig", "{tmp}/kc"),
        2,
        ("kubeconfig", "must be a mapping"),
        {"kc": b"hello\n"},
    ),
    "kubeconfig-empty-config": Case(
        (*RUN, "--kube", "--node-name", "n", "--kubeconfig", "{tmp}/kc"),
        2,
        ("kubeconfig",),
        {"kc": b"apiVersion: v1\nkind: Config\n"},
    ),
}


@pytest.fixture
def node(
    tmp_path: Path, cli: Callable[..., Result]
) -> Callable[[Case], tuple[Result, bytes, bytes]]:
    """Runs a case against an emulated H200 node kept in a state file; returns the result and
    the state file before and after."""
    state = tmp_path / "node.json"
    assert cli("--simulate", "h200", "--sim-state", str(state), "status").returncode == 0

    def run(case: Case) -> tuple[Result, bytes, bytes]:
        for name, content in case.files.items():
            (tmp_path / name).parent.mkdir(exist_ok=True)
            if content == FIFO:
                os.mkfifo(tmp_path / name)
            else:
                (tmp_path / name).write_bytes(content)
        argv = [a.replace("{tmp}", str(tmp_path)) for a in case.argv]
        env = {"NODEAGENT_SIMULATE": "h200", "NODEAGENT_SIM_STATE": str(state), **case.env}
        before = state.read_bytes()
        res = cli(*argv, env=env, stdin=case.stdin)
        return res, before, state.read_bytes()

    return run


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input(node: Callable[[Case], tuple[Result, bytes, bytes]], name: str) -> None:
    case = CASES[name]
    res, before, after = node(case)
    assert res.returncode == case.code, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    unsafe = {"\x1b", "\x07", "\u2028", "\u2029", "\u202e", "\r"} & set(res.stderr)
    assert not unsafe, res.stderr  # names from files and flags reach the terminal escaped
    lines = res.stderr.strip().splitlines()
    if case.words:
        assert (lines and lines[0].startswith("nodeagent: ")) or "usage:" in res.stderr, res.stderr
        if not case.multi and "usage:" not in res.stderr:
            assert len(lines) == 1, res.stderr
        for word in case.words:
            assert word in res.stderr, (word, res.stderr)
        assert len(res.stderr) < 10_000  # capped: the first 20 problems and a count
    assert after == before  # nothing changed on the node


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 80


# -- the MIG config parser against arbitrary input: a result or a ConfigError, nothing else --


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_parser_on_arbitrary_bytes(data: bytes) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # decoding is load_config's job, covered by the corpus
    with contextlib.suppress(ConfigError):
        parse_config(text, "fuzz.yaml")


YAML_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["all", "v1", "1g.18gb", "3g.71gb+me", "0x233510DE", "mig-enabled"]),
)
YAML_TREES = st.recursive(
    YAML_LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(
                st.sampled_from(
                    [
                        "version",
                        "mig-configs",
                        "devices",
                        "mig-enabled",
                        "mig-devices",
                        "device-filter",
                        "a",
                    ]
                ),
                st.text(max_size=8),
            ),
            children,
            max_size=4,
        ),
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        YAML_TREES, st.fixed_dictionaries({"version": st.just("v1"), "mig-configs": YAML_TREES})
    )
)
def test_parser_on_arbitrary_yaml_trees(tree: object) -> None:
    text = yaml.safe_dump(tree)
    with contextlib.suppress(ConfigError):
        parse_config(text, "fuzz.yaml")


def test_no_case_changes_the_environment() -> None:
    """CI sets NODEAGENT_REQUIRE_PROMETHEUS itself: compare with what the process began with."""
    assert {k: v for k, v in os.environ.items() if k.startswith("NODEAGENT_")} == ENV_AT_IMPORT
