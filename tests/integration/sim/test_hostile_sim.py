"""Hostile input to the emulator, run as a user runs it: a state file that is garbage, of the wrong
shape or holds a GPU no hardware could be in; a state path that is a link, a folder, a FIFO or in
no folder; bad NODEAGENT_SIM_FAULTS rules; bad simulate specs; `sim` commands the GPU refuses.

Each row: argv ({state} is the state file's path, {tmp} the test's folder), environment, the
state file's bytes before the run (None: no file), the exit code, words of the one stderr
sentence, and whether the state file must be left exactly as it was (or not created).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.base.errors import SimError
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.sim.models import load_model
from nodeagent.sim.state import UUID_SERIALS, fresh_state, to_json
from nodeagent.sim.statefile import load_state
from tests.support.cli import Result, assert_one_error

Cli = Callable[..., Result]
GIB = 1024**3

# -- state files ---------------------------------------------------------------------------------


def _node(
    models: tuple[str, ...] = ("h200",),
    mig: int = 0,
    gis: tuple[dict[str, Any], ...] = (),
    processes: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    """The JSON of a node as the emulator writes it, GPU 0 with MIG mode `mig` and `gis`."""
    data = to_json(fresh_state(list(models)))
    gpu = data["gpus"][0]
    gpu["mig_current"] = gpu["mig_pending"] = mig
    gpu["gis"] = {str(g["id"]): g for g in gis}
    data["processes"] = list(processes)
    return data


def _gi(gi_id: int, profile: int, start: int, size: int, *cis: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": gi_id,
        "profile_id": profile,
        "start": start,
        "size": size,
        "cis": {str(c["id"]): c for c in cis},
    }


def _ci(ci_id: int, profile: int, uuid: str) -> dict[str, Any]:
    return {"id": ci_id, "profile_id": profile, "uuid": uuid}


def _proc(
    pid: int, gpu: int = 0, gib: int = 1, gi: int | None = None, ci: int | None = None
) -> dict[str, Any]:
    return {
        "pid": pid,
        "gpu": gpu,
        "memory_bytes": gib * GIB,
        "gi_id": gi,
        "ci_id": ci,
        "load": 1.0,
    }


def _bytes(data: Any) -> bytes:
    return json.dumps(data, indent=1).encode()


def _edit(change: Callable[[dict[str, Any]], Any], data: dict[str, Any] | None = None) -> bytes:
    """A good state file with one thing changed in place by `change`."""
    data = copy.deepcopy(data or _node())
    change(data)
    return _bytes(data)


def _text(text: str) -> bytes:
    return text.encode()


GOOD = _bytes(_node())
MIG_GPU = _node(mig=1, gis=(_gi(1, 9, 0, 4, _ci(0, 2, "MIG-a")),))  # a 3g.71gb with its one CI
BUSY = _bytes(_node(processes=(_proc(42),)))
STATUS = ("--simulate", "h200", "--sim-state", "{state}", "status")
SIM = ("--simulate", "h200", "--sim-state", "{state}", "sim")


def _gpu0(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["gpus"][0].__setitem__(key, value)


def _drop_gpu0(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["gpus"][0].pop(key)


# -- setups for paths that are not plain files ---------------------------------------------------


def _fifo(tmp: Path) -> None:
    os.mkfifo(tmp / "node.json")


def _link_loop(tmp: Path) -> None:
    (tmp / "node.json").symlink_to(tmp / "node.json")


def _link_to_missing_folder(tmp: Path) -> None:
    (tmp / "node.json").symlink_to(tmp / "gone" / "node.json")


def _file_as_folder(tmp: Path) -> None:
    (tmp / "afile").write_text("x")


def _read_only_folder(tmp: Path) -> None:
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o500)


@dataclass(frozen=True)
class Row:
    argv: tuple[str, ...]
    code: int
    words: tuple[str, ...]
    state: bytes | None = None
    env: dict[str, str] = field(default_factory=dict)
    unchanged: bool = True
    setup: Callable[[Path], None] | None = None


def _faults(rules: Any, *words: str) -> Row:
    text = rules if isinstance(rules, str) else json.dumps(rules)
    return Row(STATUS, 2, ("NODEAGENT_SIM_FAULTS", *words), GOOD, {"NODEAGENT_SIM_FAULTS": text})


def _corrupt(state: bytes, *words: str) -> Row:
    return Row(STATUS, 2, ("{state}", "corrupt", *words), state)


def _impossible(data: dict[str, Any], *words: str) -> Row:
    return Row(STATUS, 2, ("{state}", "impossible", *words), _bytes(data))


def _spec(spec: str, *words: str) -> Row:
    return Row(("--simulate", spec, "--sim-state", "{state}", "status"), 2, (repr(spec), *words))


ROWS = {
    # 1. a state file that is not a state file
    "random-bytes": _corrupt(bytes(range(255, 0, -7)), "not UTF-8"),
    "latin-1-byte": _corrupt(b'{"version": 1, "gpus": "caf\xe9"}', "not UTF-8 text (byte 27)"),
    "empty-file": _corrupt(b"", "not JSON"),
    "truncated": _corrupt(GOOD[:-30], "not JSON"),
    "not-json": _corrupt(b"version: 1\n", "not JSON"),
    "nan-at-top": _corrupt(b"NaN", "NaN is not a JSON number"),
    "a-list": _corrupt(b"[]", "the top level must be an object, not a list"),
    "empty-object": _corrupt(b"{}", "lacks the key 'version'"),
    "gpus-a-number": _corrupt(b'{"version": 1, "gpus": 5, "processes": []}', "gpus must be a list"),
    "no-gpus": _corrupt(b'{"version": 1, "gpus": [], "processes": []}', "gpus is empty"),
    "version-2": _corrupt(_edit(lambda d: d.update(version=2)), "version 2"),
    "version-true": _corrupt(_edit(lambda d: d.update(version=True)), "version true"),
    "unknown-key": _corrupt(_edit(lambda d: d.update(extra=1)), "unknown key 'extra'"),
    "gpu-missing-key": _corrupt(_edit(_drop_gpu0("uuid")), "gpus[0] lacks the key 'uuid'"),
    "gpu-a-string": _corrupt(_edit(lambda d: d.update(gpus=["h200"])), "gpus[0] must be an object"),
    "mig-as-string": _corrupt(
        _edit(_gpu0("mig_current", "1")), "gpus[0].mig_current must be an integer"
    ),
    "mig-as-float": _corrupt(_edit(_gpu0("mig_current", 1.0)), "mig_current must be an integer"),
    "mig-mode-2": _corrupt(_edit(_gpu0("mig_pending", 2)), "mig_pending must be one of 0, 1"),
    "compute-mode-1": _corrupt(_edit(_gpu0("compute_mode", 1)), "compute_mode"),
    "index-off": _corrupt(_edit(_gpu0("index", 3)), "gpus[0].index must be 0, not 3"),
    "unknown-model": _corrupt(_edit(_gpu0("model", "v100")), '"v100" is none of'),
    "uuid-empty": _corrupt(_edit(_gpu0("uuid", "")), "gpus[0].uuid"),
    "uuid-huge": _corrupt(_edit(_gpu0("uuid", "G" * 5000)), "gpus[0].uuid", "..."),
    "pid-a-float": _corrupt(
        _bytes(_node(processes=({**_proc(7), "pid": 7.5},))), "processes[0].pid must be an integer"
    ),
    "pid-huge": _corrupt(
        _bytes(_node(processes=({**_proc(7), "pid": 10**30},))), "processes[0].pid must be 1 to"
    ),
    "memory-negative": _corrupt(
        _bytes(_node(processes=({**_proc(7), "memory_bytes": -1},))), "memory_bytes"
    ),
    "number-5000-digits": _corrupt(
        GOOD.replace(b'"uuid_serial": 0', b'"uuid_serial": ' + b"9" * 5000), "number is too long"
    ),
    "load-nan": _corrupt(
        _bytes(_node(processes=(_proc(7),))).replace(b'"load": 1.0', b'"load": NaN'), "NaN"
    ),
    "load-infinite": _corrupt(
        _bytes(_node(processes=(_proc(7),))).replace(b'"load": 1.0', b'"load": 1e999'),
        "load must be a number from 0 to 1",
    ),
    "load-2": _corrupt(
        _bytes(_node(processes=({**_proc(7), "load": 2},))),
        "load must be a number from 0 to 1, not 2",
    ),
    "key-twice": _corrupt(
        GOOD.replace(b'"version": 1', b'"version": 1, "version": 1'), "'version' twice"
    ),
    "over-16-mib": Row(STATUS, 2, ("{state}", "is larger than 16 MiB"), b" " * (16 * 2**20 + 1)),
    "nested-deep": _corrupt(b"[" * 100_000, "nested too deeply"),
    "gi-id-a-string": _corrupt(
        _bytes(_node(mig=1, gis=({**_gi(1, 19, 0, 1), "id": "1"},))), "gis.1.id must be an integer"
    ),
    # 2. a state file whose GPU could not be so
    "2g-at-slice-7": _impossible(
        _node(mig=1, gis=(_gi(1, 14, 7, 2),)),
        "GPU 0 GI 1 (2g.35gb)",
        "placement 7:2",
        "0:2, 2:2, 4:2",
    ),
    "beyond-the-slices": _impossible(
        _node(mig=1, gis=(_gi(1, 19, 8, 1),)), "GPU 0 GI 1 (1g.18gb)", "placement 8:1"
    ),
    "size-not-the-profiles": _impossible(
        _node(mig=1, gis=(_gi(1, 9, 0, 2),)), "GPU 0 GI 1 (3g.71gb)", "placement 0:2"
    ),
    "overlap": _impossible(
        _node(mig=1, gis=(_gi(1, 9, 0, 4), _gi(2, 14, 2, 2))),
        "GPU 0 GI 2 (2g.35gb)",
        "overlap GI 1",
    ),
    "unknown-profile": _impossible(
        _node(mig=1, gis=(_gi(1, 99, 0, 1),)), "GPU 0 GI 1", "profile id 99"
    ),
    "a-second-me": _impossible(
        _node(mig=1, gis=(_gi(1, 20, 0, 1), _gi(2, 20, 1, 1))), "GPU 0 GI 2", "at most 1 instances"
    ),
    "ci-too-big": _impossible(
        _node(mig=1, gis=(_gi(1, 19, 0, 1, _ci(0, 4, "MIG-x")),)),
        "GPU 0 GI 1 (1g.18gb) CI 0",
        "no compute-instance profile 4",
    ),
    "ci-over-capacity": _impossible(
        _node(mig=1, gis=(_gi(1, 14, 0, 2, _ci(0, 1, "MIG-x"), _ci(1, 0, "MIG-y")),)),
        "GPU 0 GI 1 (2g.35gb) CI 1",
        "overlap CI 0",
    ),
    "ci-profile-unknown": _impossible(
        _node(mig=1, gis=(_gi(1, 0, 0, 8, _ci(0, 77, "MIG-x")),)), "CI 0", "profile 77"
    ),
    "process-on-a-missing-ci": _impossible(
        {**MIG_GPU, "processes": [_proc(7, gi=1, ci=3)]},
        "process 7",
        "GPU 0 GI 1 CI 3, which does not exist",
    ),
    "process-on-a-missing-gi": _impossible(
        {**MIG_GPU, "processes": [_proc(7, gi=5, ci=0)]},
        "process 7",
        "GI 5 CI 0, which does not exist",
    ),
    "health-unknown-key": _corrupt(
        _edit(_gpu0("health", {"fan": 3})), "gpus[0].health has an unknown key 'fan'"
    ),
    "health-temperature-hot": _corrupt(
        _edit(_gpu0("health", {"temperature_celsius": 900})), "health.temperature_celsius"
    ),
    "health-power-nan": _corrupt(
        _edit(_gpu0("health", {"power_watts": "nan"})), "health.power_watts must be a number"
    ),
    "health-ecc-negative": _corrupt(
        _edit(_gpu0("health", {"ecc_uncorrected": -1})), "health.ecc_uncorrected"
    ),
    "health-throttle-unknown": _corrupt(
        _edit(_gpu0("health", {"throttle": ["hot"]})), "health.throttle[0]"
    ),
    "health-xids-without-serial": _corrupt(
        _edit(_gpu0("health", {"xids": [79]})), "health.xids holds 1 codes"
    ),
    "gi-key-not-its-id": _corrupt(
        _edit(_gpu0("gis", {"2": _gi(1, 19, 0, 1)}), MIG_GPU), "gis.2 holds the id 1"
    ),
    "gi-id-twice": _corrupt(
        _edit(_gpu0("gis", {"1": _gi(1, 19, 0, 1), "DUP": _gi(1, 19, 1, 1)}), MIG_GPU).replace(
            b'"DUP"', b'"1"'
        ),
        "'1' twice",
    ),
    "mig-instances-with-mig-off": _impossible(
        _node(mig=0, gis=(_gi(1, 19, 0, 1),)), "GPU 0 has MIG instances while its MIG mode is off"
    ),
    "process-on-a-missing-gpu": _impossible(
        _node(processes=(_proc(7, gpu=3),)), "process 7 runs on GPU 3, which does not exist"
    ),
    "process-on-whole-mig-gpu": _impossible(
        {**MIG_GPU, "processes": [_proc(7)]}, "whole GPU 0, which has MIG enabled"
    ),
    "process-gi-without-ci": _impossible(
        {**MIG_GPU, "processes": [_proc(7, gi=1)]}, "process 7", "not both"
    ),
    "memory-over-the-gpus": _impossible(
        _node(processes=(_proc(7, gib=100), _proc(8, gib=100))), "processes on GPU 0 use 204800 MiB"
    ),
    "memory-over-the-slices": _impossible(
        {**MIG_GPU, "processes": [_proc(7, gi=1, ci=0, gib=80)]},
        "GPU 0 GI 1 CI 0 use 81920 MiB of the 71424 MiB",
    ),
    "pid-twice": _impossible(_node(processes=(_proc(7), _proc(7))), "pid 7 runs twice"),
    "mig-uuid-twice": _impossible(
        _node(
            mig=1, gis=(_gi(1, 19, 0, 1, _ci(0, 0, "MIG-a")), _gi(2, 19, 1, 1, _ci(0, 0, "MIG-a")))
        ),
        "GPU 0 GI 2 CI 0 has the UUID MIG-a",
    ),
    "many-problems": _impossible(
        _node(processes=tuple(_proc(7, gpu=9) for _ in range(5))), "GPU 9", "and 6 more"
    ),
    # 3. a state path that is no plain file in a writable folder
    "a-folder": Row(
        ("--simulate", "h200", "--sim-state", "{tmp}", "status"), 2, ("{tmp}", "is a directory")
    ),
    "a-fifo": Row(STATUS, 2, ("{state}", "it is a FIFO, not a file"), setup=_fifo),
    "dev-null": Row(
        ("--simulate", "h200", "--sim-state", "/dev/null", "status"),
        2,
        ("/dev/null", "a character device, not a file"),
    ),
    "link-loop": Row(STATUS, 2, ("{state}", "cannot read", "symbolic links"), setup=_link_loop),
    "no-folder": Row(
        ("--simulate", "h200", "--sim-state", "{tmp}/none/node.json", "status"),
        2,
        ("{tmp}/none/node.json", "no folder {tmp}/none"),
    ),
    "link-to-no-folder": Row(
        STATUS, 2, ("{state}", "no folder {tmp}/gone"), setup=_link_to_missing_folder
    ),
    "folder-is-a-file": Row(
        ("--simulate", "h200", "--sim-state", "{tmp}/afile/node.json", "status"),
        2,
        ("{tmp}/afile/node.json", "Not a directory"),
        setup=_file_as_folder,
    ),
    "read-only-folder": pytest.param(
        Row(
            ("--simulate", "h200", "--sim-state", "{tmp}/ro/node.json", "status"),
            2,
            ("cannot write emulator state file {tmp}/ro/node.json", "Permission denied"),
            setup=_read_only_folder,
        ),
        marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes any folder"),
    ),
    # 4. NODEAGENT_SIM_FAULTS
    "faults-not-json": _faults("[{", "is not JSON"),
    "faults-not-a-list": _faults({"error": "IN_USE"}, "must be a JSON list"),
    "faults-rule-not-object": _faults([5], "NODEAGENT_SIM_FAULTS[0] must be an object"),
    "faults-unknown-key": _faults([{"error": "IN_USE", "func": "x"}], "[0]", "unknown key 'func'"),
    "faults-exit-abc": _faults([{"exit": "abc"}], "[0]", "'exit' must be a process exit status"),
    "faults-exit-300": _faults([{"exit": 300}], "[0]", "'exit'", "300"),
    "faults-exit-true": _faults([{"exit": True}], "[0]", "'exit'", "True"),
    "faults-call-x": _faults(
        [{"call": "x", "error": "IN_USE"}],
        "[0]",
        "'call' must be a whole number from 1 up, not 'x'",
    ),
    "faults-call-0": _faults([{"call": 0, "error": "IN_USE"}], "[0]", "'call'", "not 0"),
    "faults-call-negative": _faults([{"call": -2, "error": "IN_USE"}], "[0]", "'call'", "not -2"),
    "faults-mutation-float": _faults([{"mutation": 1.5, "exit": 1}], "[0]", "'mutation'", "1.5"),
    "faults-error-unknown-name": _faults(
        [{"error": "ON_FIRE"}], "[0]", "unknown NVML error 'ON_FIRE'"
    ),
    "faults-error-unknown-code": _faults([{"error": 12345}], "[0]", "12345 is no NVML error code"),
    "faults-error-a-list": _faults(
        [{"error": ["IN_USE"]}], "[0]", "'error' must be an NVML error name or code"
    ),
    "faults-unknown-function": _faults(
        [{"function": "nvmlDeviceExplode", "error": "IN_USE"}],
        "[0]",
        "'nvmlDeviceExplode' is no NVML function",
    ),
    "faults-function-not-text": _faults(
        [{"function": 7, "error": "IN_USE"}], "[0]", "'function' 7"
    ),
    "faults-when-during": _faults(
        [{"exit": 1, "when": "during"}], "[0]", "'before' or 'after'", "'during'"
    ),
    "faults-neither": _faults([{"call": 1}], "[0]", "exactly one of 'error' or 'exit'"),
    "faults-both": _faults([{"error": "IN_USE", "exit": 1}], "[0]", "exactly one"),
    "faults-second-rule": _faults(
        [{"error": "IN_USE", "call": 9}, {"call": 1}], "NODEAGENT_SIM_FAULTS[1]"
    ),
    # 5. what the sim commands answer
    "reset-a-busy-gpu": Row(
        (*SIM, "reset", "--gpu", "0"), 3, ("GPU 0", "processes 42 run on it", "NVML error 19"), BUSY
    ),
    "detach-an-unknown-pid": Row(
        (*SIM, "detach", "--pid", "12345"), 1, ("no emulated process with pid 12345",), BUSY
    ),
    "detach-pid-0": Row((*SIM, "detach", "--pid", "0"), 2, ("--pid", "not 0"), BUSY),
    "attach-an-unknown-device": Row(
        (*SIM, "attach", "--device", "7", "--pid", "5"), 2, ("GPU 7 does not exist",), BUSY
    ),
    "attach-an-unknown-uuid": Row(
        (*SIM, "attach", "--device", "GPU-nope", "--pid", "5"), 2, ("'GPU-nope'",), BUSY
    ),
    "attach-a-pid-twice": Row(
        (*SIM, "attach", "--device", "0", "--pid", "42"), 2, ("pid 42 is already attached",), BUSY
    ),
    "attach-a-huge-pid": Row(
        (*SIM, "attach", "--device", "0", "--pid", "99999999999"), 2, ("--pid", "99999999999"), BUSY
    ),
    "attach-nan-load": Row(
        (*SIM, "attach", "--device", "0", "--pid", "5", "--load", "nan"), 2, ("--load",), BUSY
    ),
    "detach-no-file-yet": Row((*SIM, "detach", "--pid", "-1"), 2, ("--pid",)),
    # 6. simulate specs
    "spec-blank-parts": Row(
        ("--simulate", " , ", "--sim-state", "{state}", "status"), 2, ("simulate spec ','", "empty")
    ),
    "spec-empty-part": _spec("h200,,a30", "empty part"),
    "spec-x0": _spec("h200x0", "count must be 1..255"),
    "spec-x-1": _spec("h200x-1", "count must be 1..255"),
    "spec-x100000": _spec("h200x100000", "count must be 1..255"),
    "spec-256-gpus": _spec("h200x200,a30x56", "asks for 256 GPUs; at most 255"),
    "spec-unknown-model": _spec("v100x2", "known models"),
    "spec-inner-space": _spec("h200 x2", "no known GPU model"),
    "spec-tab": _spec("h200\tx2", "no known GPU model"),
    "spec-non-ascii-count": _spec("h200x\u0663", "no known GPU model"),
}


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{state}", str(tmp / "node.json")).replace("{tmp}", str(tmp))


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_hostile_input_is_one_sentence_and_changes_nothing(
    cli: Cli, tmp_path: Path, row: Row
) -> None:
    state = tmp_path / "node.json"
    if row.setup:
        row.setup(tmp_path)
    if row.state is not None:
        state.write_bytes(row.state)
    before = sorted(tmp_path.iterdir())
    res = cli(*(_fill(a, tmp_path) for a in row.argv), env=row.env)
    assert_one_error(res, row.code, *(_fill(w, tmp_path) for w in row.words))
    if row.unchanged:
        if row.state is not None:
            assert state.read_bytes() == row.state
        # Nothing created but the emulator's lock file beside the state file.
        after = [p for p in sorted(tmp_path.iterdir()) if p.name != "node.json.lock"]
        assert after == before


def test_faults_with_exit_parse_in_a_process(cli_process: Cli, tmp_path: Path) -> None:
    """A valid exit rule still ends the process at the rule's call, as before."""
    rule = [{"function": "nvmlDeviceGetCount", "exit": 77}]
    res = cli_process(
        "--simulate", "h200", "status", env={"NODEAGENT_SIM_FAULTS": json.dumps(rule)}
    )
    assert res.returncode == 77


def test_a_fault_on_an_alias_hits_the_function(cli: Cli) -> None:
    """`..._v3` is the same function as the one without the suffix: a rule on either fires."""
    rule = [{"function": "nvmlDeviceGetComputeRunningProcesses_v3", "error": "GPU_IS_LOST"}]
    res = cli("--simulate", "h200", "status", env={"NODEAGENT_SIM_FAULTS": json.dumps(rule)})
    assert_one_error(res, 3, "nvmlDeviceGetComputeRunningProcesses")


def test_reset_of_an_idle_gpu_still_works(cli: Cli, tmp_path: Path) -> None:
    state = tmp_path / "node.json"
    state.write_bytes(BUSY)
    base = ("--simulate", "h200", "--sim-state", str(state), "sim")
    assert cli(*base, "detach", "--pid", "42").returncode == 0
    assert cli(*base, "reset", "--gpu", "0").returncode == 0


def test_a_linked_state_file_is_written_through_the_link(cli: Cli, tmp_path: Path) -> None:
    """The link stays a link; the file it points to gets the change (README, 'The emulator')."""
    target = tmp_path / "real" / "node.json"
    target.parent.mkdir()
    target.write_bytes(GOOD)
    target.chmod(0o640)
    link = tmp_path / "node.json"
    link.symlink_to(target)
    res = cli(
        "--simulate",
        "h200",
        "--sim-state",
        str(link),
        "sim",
        "attach",
        "--device",
        "0",
        "--pid",
        "9",
    )
    assert res.returncode == 0, res.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert [p["pid"] for p in json.loads(target.read_text())["processes"]] == [9]
    assert target.stat().st_mode & 0o777 == 0o640


def test_a_dangling_link_gets_its_file_created(cli: Cli, tmp_path: Path) -> None:
    target = tmp_path / "node-target.json"
    link = tmp_path / "node.json"
    link.symlink_to(target)
    assert cli("--simulate", "h200x2", "--sim-state", str(link), "status").returncode == 0
    assert link.is_symlink()
    assert len(json.loads(target.read_text())["gpus"]) == 2


def test_a_state_at_its_uuid_serial_limit_is_written_so_it_reads_back(
    cli: Cli, tmp_path: Path
) -> None:
    """Issue 39 class 5: the loader takes uuid_serial up to 2**63 - 2; slices made from there
    wrap the serial within that range (and skip a UUID in use), never past it."""
    state = tmp_path / "node.json"
    doc = json.loads(GOOD)
    doc["gpus"][0]["uuid_serial"] = UUID_SERIALS - 2
    state.write_text(json.dumps(doc))
    base = ("--simulate", "h200", "--sim-state", str(state))
    config = tmp_path / "mig.yaml"
    made = cli(*base, "mig", "generate-config")
    assert made.returncode == 0, made.stderr
    config.write_text(made.stdout)
    applied = cli(*base, "mig", "apply", "-f", str(config), "-c", "all-1g.18gb")
    assert applied.returncode == 0, applied.stderr
    loaded = load_state(state)
    assert loaded is not None
    (gpu,) = loaded[0].gpus
    uuids = [ci.uuid for gi in gpu.gis.values() for ci in gi.cis.values()]
    assert len(uuids) == 7 == len(set(uuids))
    assert 0 <= gpu.uuid_serial < UUID_SERIALS - 2  # it wrapped
    assert cli(*base, "status").returncode == 0


@pytest.mark.parametrize("spec", ["", "   ", ",", "h200,"])
def test_an_empty_spec_is_refused(spec: str) -> None:
    """(On the command line `--simulate ''` means "not set": the settings' rule for '' values.)"""
    with pytest.raises(SimError, match="empty"):
        parse_spec(spec)


# -- the check is no stricter than the emulator --------------------------------------------------


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    model=st.sampled_from(["h200", "a30", "a100-40gb"]),
    serial=st.sampled_from([0, UUID_SERIALS - 3, UUID_SERIALS - 1]),
    picks=st.lists(
        st.tuples(st.integers(0, 20), st.integers(0, 10), st.integers(0, 6)), max_size=12
    ),
)
def test_every_state_the_emulator_reaches_loads_back(
    tmp_path: Path, model: str, serial: int, picks: list[tuple[int, int, int]]
) -> None:
    """Random GI/CI creations (many refused by the emulator's rules), from a MIG UUID serial
    anywhere up to its limit; what it keeps reloads."""
    state = tmp_path / f"{model}.json"
    state.unlink(missing_ok=True)
    lib = SimulatedNvml([model], state)
    lib.nvmlInit()
    lib.state.gpus[0].uuid_serial = serial
    dev = lib.nvmlDeviceGetHandleByIndex(0)
    lib.nvmlDeviceSetMigMode(dev, 1)
    lib.reset(0)  # Ampere: the mode applies at reset
    profiles = [p for p in range(18) if _supported(lib, dev, p)]
    for pick, placement, ci_profile in picks:
        info = lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, profiles[pick % len(profiles)])
        try:
            gi = (
                lib.nvmlDeviceCreateGpuInstance(dev, info.id)
                if placement > 7
                else _place(lib, dev, info.id, placement)
            )
            lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
            lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
        except pynvml.NVMLError:
            pass
    loaded = load_state(state)
    assert loaded is not None and loaded[0] == lib.state


def _supported(lib: SimulatedNvml, dev: Any, constant: int) -> bool:
    try:
        lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, constant)
    except pynvml.NVMLError:
        return False
    return True


def _place(lib: SimulatedNvml, dev: Any, profile_id: int, start: int) -> Any:
    """Create a GI at `start` with the profile's size there (any size when none starts there)."""
    profile = load_model(lib.state.gpus[0].model).profile_by_id(profile_id)
    assert profile is not None
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start = start
    placement.size = next((n for s, n in profile.placements if s == start), 1)
    return lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, placement)
