"""The emulator's state file: read strictly, checked against the hardware's rules, written
atomically (through a symbolic link to the file it points to).

A state file is written by the emulator, but a user may hand it anything (`--sim-state
/dev/zero`, a truncated or hand-edited file, one of another version). Every defect is a SimError
of one sentence naming the file, and a file that is refused is left as it is.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from nodeagent.base.errors import ConfigError, SimError
from nodeagent.base.files import atomic_write_text, read_regular
from nodeagent.sim.check import state_problems
from nodeagent.sim.health import (
    MAX_RECOVERY_ACTION,
    MAX_TEMPERATURE,
    MAX_WATTS,
    REASON_NAMES,
    U32_MAX,
    U64_MAX,
)
from nodeagent.sim.models import MODEL_NAMES
from nodeagent.sim.rules import CI_IDS, COMPUTE_MODES, GI_IDS, MAX_PID
from nodeagent.sim.state import (
    STATE_VERSION,
    UUID_SERIALS,
    XID_LOG,
    CiState,
    GiState,
    GpuState,
    HealthState,
    ProcessState,
    SimState,
)

MAX_STATE_BYTES = 16 * 1024 * 1024  # 64 GPUs of 7 slices each: ~150 KiB
MAX_PROBLEMS_SHOWN = 3
_I64 = 2**63 - 1
Stamp = tuple[int, int, int]  # (inode, modification time in ns, size) of one version
_ID_TEXT = re.compile(r"[!-~]{1,80}")  # printable ASCII without spaces, as NVML's UUID buffers


class _Corrupt(Exception):
    """A defect of the file's shape; `str()` says where and what."""


def _fail(message: str) -> NoReturn:
    raise _Corrupt(message)


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _object(
    value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Any:
    if not isinstance(value, dict):
        _fail(f"{where} must be an object, not {_show(value)}")
    for key in required:
        if key not in value:
            _fail(f"{where} lacks the key {key!r}")
    for key in value:
        if key not in required and key not in optional:
            _fail(f"{where} has an unknown key {key!r}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        _fail(f"{where} must be a list, not {_show(value)}")
    return value


def _int(value: Any, where: str, allowed: range | tuple[int, ...]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(f"{where} must be an integer, not {_show(value)}")
    if value not in allowed:
        # range.__len__ is a C size: a 64-bit counter's range has no len()
        single = (
            allowed.stop - allowed.start == 1 if isinstance(allowed, range) else (len(allowed) == 1)
        )
        if single:
            _fail(f"{where} must be {allowed[0]}, not {value}")
        if isinstance(allowed, range):
            _fail(f"{where} must be {allowed.start} to {allowed.stop - 1}, not {value}")
        _fail(f"{where} must be one of {', '.join(map(str, allowed))}, not {value}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        _fail(f"{where} must be true or false, not {_show(value)}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _ID_TEXT.fullmatch(value):
        _fail(f"{where} must be 1 to 80 printable characters without spaces, not {_show(value)}")
    return value


def _keyed(value: Any, where: str) -> dict[str, Any]:
    """A JSON object of instances keyed by their id (as the emulator writes gis and cis)."""
    if not isinstance(value, dict):
        _fail(f"{where} must be an object, not {_show(value)}")
    items: dict[str, Any] = value
    for key, item in items.items():
        if not isinstance(item, dict):
            _fail(f"{where}.{key} must be an object, not {_show(item)}")
        got = item.get("id")
        if str(got) != key:
            _fail(f"{where}.{key} holds the id {_show(got)}; the key must be its id")
    return items


def _ci(raw: Any, where: str) -> CiState:
    _object(raw, where, ("id", "profile_id", "uuid"), ("start",))
    return CiState(
        id=_int(raw["id"], f"{where}.id", CI_IDS),
        profile_id=_int(raw["profile_id"], f"{where}.profile_id", range(0, 256)),
        uuid=_text(raw["uuid"], f"{where}.uuid"),
        start=_int(raw.get("start", 0), f"{where}.start", range(0, 16)),
    )


def _gi(raw: Any, where: str) -> GiState:
    _object(raw, where, ("id", "profile_id", "start", "size", "cis"))
    cis = _keyed(raw["cis"], f"{where}.cis")
    return GiState(
        id=_int(raw["id"], f"{where}.id", GI_IDS),
        profile_id=_int(raw["profile_id"], f"{where}.profile_id", range(0, 256)),
        start=_int(raw["start"], f"{where}.start", range(0, 64)),
        size=_int(raw["size"], f"{where}.size", range(1, 65)),
        cis={ci.id: ci for ci in (_ci(c, f"{where}.cis.{k}") for k, c in cis.items())},
    )


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        _fail(f"{where} must be a number from {low:g} to {high:g}, not {_show(value)}")
    return float(value)


def _optional(value: Any, where: str, allowed: range) -> int | None:
    return None if value is None else _int(value, where, allowed)


def _health(raw: Any, where: str) -> HealthState:
    counters = (
        "ecc_corrected", "ecc_uncorrected", "ecc_corrected_at_reset", "ecc_uncorrected_at_reset",
        "pcie_replays", "energy_mj", "xid_serial",
    )  # fmt: skip
    overrides = ("temperature_celsius", "power_watts", "sm_clock_mhz", "memory_clock_mhz")
    flags = ("row_remap_pending", "row_remap_failure")
    _object(
        raw,
        where,
        (),
        (*counters, *overrides, *flags, "throttle", "energy_at", "xids", "xid_gis",
         "recovery_action"),
    )  # fmt: skip
    health = HealthState()  # a file of an older nodeagent: the emulated driver loads now
    if "energy_at" in raw:
        health.energy_at = _number(raw["energy_at"], f"{where}.energy_at", 0, 1e12)
    for key in counters:  # each as wide as NVML's counter: every value the emulator writes
        top = U32_MAX if key == "pcie_replays" else U64_MAX
        setattr(health, key, _int(raw.get(key, 0), f"{where}.{key}", range(0, top + 1)))
    for key in flags:
        setattr(health, key, _int(raw.get(key, 0), f"{where}.{key}", (0, 1)))
    for key in ("corrected", "uncorrected"):
        if getattr(health, f"ecc_{key}_at_reset") > getattr(health, f"ecc_{key}"):
            _fail(f"{where}.ecc_{key}_at_reset is above its ecc_{key}")
    health.recovery_action = _optional(
        raw.get("recovery_action", 0), f"{where}.recovery_action", range(0, MAX_RECOVERY_ACTION + 1)
    )
    health.temperature_celsius = _optional(
        raw.get("temperature_celsius"), f"{where}.temperature_celsius", range(0, MAX_TEMPERATURE)
    )
    for key in ("sm_clock_mhz", "memory_clock_mhz"):
        setattr(health, key, _optional(raw.get(key), f"{where}.{key}", range(0, 100_000)))
    if raw.get("power_watts") is not None:
        health.power_watts = _number(raw["power_watts"], f"{where}.power_watts", 0, MAX_WATTS)
    if raw.get("throttle") is not None:
        reasons = _list(raw["throttle"], f"{where}.throttle")
        for i, name in enumerate(reasons):
            if name not in REASON_NAMES:
                _fail(f"{where}.throttle[{i}] {_show(name)} is no clock-event reason")
        health.throttle = list(reasons)
    xids = _list(raw.get("xids", []), f"{where}.xids")
    if len(xids) > min(XID_LOG, health.xid_serial):
        _fail(f"{where}.xids holds {len(xids)} codes, more than {min(XID_LOG, health.xid_serial)}")
    health.xids = [_int(x, f"{where}.xids[{i}]", range(1, 2**32)) for i, x in enumerate(xids)]
    gis = _list(raw.get("xid_gis", []), f"{where}.xid_gis")
    if len(gis) > len(xids):
        _fail(f"{where}.xid_gis holds {len(gis)} entries, more than its {len(xids)} xids")
    health.xid_gis = [
        _optional(g, f"{where}.xid_gis[{i}]", range(0, 64)) for i, g in enumerate(gis)
    ]
    return health


def _gpu(raw: Any, index: int) -> GpuState:
    where = f"gpus[{index}]"
    required = ("index", "model", "uuid", "pci_bus_id", "mig_current", "mig_pending", "gis")
    _object(raw, where, (*required, "uuid_serial"), ("compute_mode", "health", "reset_refused"))
    _int(raw["index"], f"{where}.index", range(index, index + 1))
    if raw["model"] not in MODEL_NAMES:
        _fail(f"{where}.model {_show(raw['model'])} is none of {', '.join(MODEL_NAMES)}")
    gis = _keyed(raw["gis"], f"{where}.gis")
    return GpuState(
        index=index,
        model=raw["model"],
        uuid=_text(raw["uuid"], f"{where}.uuid"),
        pci_bus_id=_text(raw["pci_bus_id"], f"{where}.pci_bus_id"),
        mig_current=_int(raw["mig_current"], f"{where}.mig_current", (0, 1)),
        mig_pending=_int(raw["mig_pending"], f"{where}.mig_pending", (0, 1)),
        gis={gi.id: gi for gi in (_gi(g, f"{where}.gis.{k}") for k, g in gis.items())},
        compute_mode=_int(raw.get("compute_mode", 0), f"{where}.compute_mode", COMPUTE_MODES),
        uuid_serial=_int(raw["uuid_serial"], f"{where}.uuid_serial", range(0, UUID_SERIALS)),
        health=_health(raw.get("health", {}), f"{where}.health"),
        reset_refused=_flag(raw.get("reset_refused", False), f"{where}.reset_refused"),
    )


def _process(raw: Any, index: int) -> ProcessState:
    where = f"processes[{index}]"
    _object(raw, where, ("pid", "gpu", "memory_bytes"), ("gi_id", "ci_id", "load", "mps_client"))
    ids = {}
    for key, allowed in (("gi_id", GI_IDS), ("ci_id", CI_IDS)):
        value = raw.get(key)
        ids[key] = None if value is None else _int(value, f"{where}.{key}", allowed)
    load = raw.get("load", 1.0)
    if isinstance(load, bool) or not isinstance(load, (int, float)) or not 0 <= load <= 1:
        _fail(f"{where}.load must be a number from 0 to 1, not {_show(load)}")
    return ProcessState(
        pid=_int(raw["pid"], f"{where}.pid", range(1, MAX_PID + 1)),
        gpu=_int(raw["gpu"], f"{where}.gpu", range(0, 1024)),
        memory_bytes=_int(raw["memory_bytes"], f"{where}.memory_bytes", range(0, _I64)),
        gi_id=ids["gi_id"],
        ci_id=ids["ci_id"],
        load=float(load),
        mps_client=_flag(raw.get("mps_client", False), f"{where}.mps_client"),
    )


def from_json(data: Any) -> SimState:
    """A SimState from the file's JSON value; raises _Corrupt at the first defect of shape."""
    _object(data, "the top level", ("version", "gpus", "processes"))
    version = data["version"]
    if isinstance(version, bool) or version != STATE_VERSION:
        _fail(f"version {_show(version)} is not {STATE_VERSION}, the only one this nodeagent reads")
    gpus = _list(data["gpus"], "gpus")
    if not gpus:
        _fail("gpus is empty")
    return SimState(
        gpus=[_gpu(g, i) for i, g in enumerate(gpus)],
        processes=[_process(p, i) for i, p in enumerate(_list(data["processes"], "processes"))],
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            _fail(f"an object has the key {key!r} twice")
        out[key] = value
    return out


def _no_constants(name: str) -> NoReturn:
    _fail(f"{name} is not a JSON number")


def _read_bytes(path: Path) -> tuple[bytes, Stamp] | None:
    """The file's bytes and the stamp of that very file, or None when it does not exist
    (yet). Read as every input is (nodeagent.base.files.read_regular: never blocks on a FIFO,
    bounded); the stamp is taken before and after the read, and a write by another process in
    between (the stamps differ) is read again, so new stamp is never paired with old bytes."""
    for _ in range(3):
        before = _stamp_of(path)
        try:
            data = read_regular(path, "emulator state file", MAX_STATE_BYTES)
        except ConfigError as err:
            raise SimError(str(err)) from err
        if data is None:
            return None
        after = _stamp_of(path)
        if after is not None and after == before:
            return data, after
    raise SimError(f"cannot read emulator state file {path}: it changes faster than it is read")


def _json_value(data: bytes) -> Any:
    """The JSON value of the file's bytes: strict UTF-8, no NaN, no key twice."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        _fail(f"not UTF-8 text (byte {err.start})")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as err:
        _fail(f"not JSON (line {err.lineno}: {err.msg})")
    except ValueError:  # int() of a number with thousands of digits
        _fail("not JSON: a number is too long")
    except RecursionError:
        _fail("not JSON: nested too deeply")


def parse_state(data: bytes, source: str) -> SimState:
    """Decode, parse and check a state file's bytes; raises SimError naming `source`."""
    try:
        state = from_json(_json_value(data))
    except _Corrupt as err:
        raise SimError(f"emulator state file {source} is corrupt: {err}") from None
    problems = state_problems(state)
    if problems:
        more = len(problems) - MAX_PROBLEMS_SHOWN
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN]) + (
            f"; and {more} more" if more > 0 else ""
        )
        raise SimError(f"emulator state file {source} holds an impossible GPU state: {shown}")
    return state


def load_state(path: Path) -> tuple[SimState, Stamp] | None:
    """Read and check the state file: its state and the stamp of the version read, or None
    when it does not exist yet. Raises SimError."""
    read = _read_bytes(path)
    return None if read is None else (parse_state(read[0], str(path)), read[1])


def file_stamp(path: Path) -> Stamp | None:
    """The stamp of the state file's current version, or None when there is none."""
    try:
        return _stamp(os.stat(path))
    except FileNotFoundError:
        return None


def real_path(path: Path) -> Path:
    """The file a state path names: a symbolic link is followed, so writes go to its target."""
    return Path(os.path.realpath(path))


class StateWriter:
    """Writes one emulator's state file, serialising only what changed since its last write.

    The file holds one GPU per line: a mutation of one GPU re-serialises that line alone, so
    an apply on N GPUs costs O(N) serialisation in all, not O(N^2) (the bytes written per
    mutation still grow with N, but as one copy of ready text).
    """

    def __init__(self) -> None:
        self._gpus: list[str] = []
        self._processes = ""

    def forget(self) -> None:
        """The state was replaced (read again from the file): serialise everything next time."""
        self._gpus = []

    def save(
        self, path: Path, state: SimState, changed: set[int] | None, previous: Stamp | None
    ) -> Stamp:
        """Write the state file atomically (a temporary file in the same folder, then rename);
        return the new version's stamp. `changed`: the GPUs changed since the last save (None:
        anything, processes included). `previous`: the stamp of the version replaced.

        A symbolic link stays; the file it points to is replaced. The caller holds the state
        file's lock, so no other write comes between the rename and the stamp. Raises
        SimError when the folder does not exist or cannot be written.
        """
        target = real_path(path)
        if not target.parent.is_dir():
            raise SimError(f"cannot write emulator state file {path}: no folder {target.parent}")
        if changed is None or len(self._gpus) != len(state.gpus):
            self._gpus = [_dumps(asdict(gpu)) for gpu in state.gpus]
            self._processes = _dumps([asdict(p) for p in state.processes])
        else:
            for index in changed:
                self._gpus[index] = _dumps(asdict(state.gpus[index]))
        text = (
            '{"gpus": [\n'
            + ",\n".join(self._gpus)
            + f'\n],\n"processes": {self._processes},\n"version": {STATE_VERSION}}}\n'
        )
        try:
            mode: int | None = stat.S_IMODE(target.stat().st_mode)
        except OSError:
            mode = None
        try:
            # Emulated state is test/demo data: atomicity matters to readers, durability does not.
            atomic_write_text(target, text, mode, durable=False)
            # Inode numbers are reused and the file system's clock is coarse: two versions
            # could share a stamp, and a reader holding the older one would miss the newer.
            # Each version's modification time is set past the one it replaced.
            mtime = max(time.time_ns(), (previous[1] + 1) if previous else 0)
            os.utime(target, ns=(mtime, mtime))
            return _stamp(target.stat())
        except OSError as err:
            raise SimError(
                f"cannot write emulator state file {path}: {err.strerror or err}"
            ) from err


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _stamp_of(path: Path) -> Stamp | None:
    try:
        return _stamp(os.stat(path))
    except OSError:  # read_regular says why
        return None


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_mtime_ns, st.st_size)
