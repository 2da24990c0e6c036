"""The workload file (nodeagent/v1): what the node should run. Strict, file:line:col in errors.

    version: nodeagent/v1
    workloads:
      - name: llm-8b              # required, unique
        replicas: 4               # default 1
        memory: 38G               # required: a size (binary units: 38G = 38 GiB)
        isolation: mig            # required: mig | shared | exclusive
        compute: 0.4              # optional: fraction of a whole GPU (0 < x <= 1), or
        sms: 40                   # optional: streaming multiprocessors (not both)
        priority: 10              # optional integer, default 0; higher is placed first
        compute-limit: 0.6        # shared only, optional: its MPS share's SM ceiling, a
                                  #   fraction (compute..1; default 1: bursts into idle SMs)
        compute-priority: low     # shared only, optional: normal | low (MPS client priority)

`mig`: a MIG slice of its own. `shared`: may share a GPU with others through MPS (a thread
percentage from its compute need, a pinned memory limit), or take a MIG slice or a whole GPU
alone. `exclusive`: a whole GPU (MIG off). `compute-limit` and `compute-priority` do not move
the plan: they go into the DRA share claims `nodeagent plan -o dra` writes (an MpsShare's
`smLimit` and `priority`). All errors of a file are raised together. Pure.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import yaml

from nodeagent.base.configfile import Errors as _Errors
from nodeagent.base.configfile import Mark, compose
from nodeagent.base.configfile import check_tags as _check_tags
from nodeagent.base.configfile import kind as _kind
from nodeagent.base.configfile import mapping as _mapping
from nodeagent.base.configfile import read_text as read_config_text
from nodeagent.base.configfile import scalar as _scalar
from nodeagent.base.errors import ConfigError
from nodeagent.mps.settings import parse_size

VERSION = "nodeagent/v1"
ISOLATIONS = ("mig", "shared", "exclusive")
KEYS = (
    "name", "replicas", "memory", "isolation", "compute", "sms", "priority", "compute-limit",
    "compute-priority",
)  # fmt: skip
COMPUTE_PRIORITIES = ("normal", "low")
MAX_REPLICAS = 4096
MAX_WORKLOADS = 256

Fields = dict[str, tuple[yaml.Node, yaml.Node]]


@dataclass(frozen=True)
class Workload:
    name: str
    replicas: int
    memory_bytes: int
    isolation: str  # mig | shared | exclusive
    priority: int = 0
    compute: float | None = None  # fraction of a whole GPU
    sms: int | None = None
    mark: Mark | None = None
    compute_limit: float | None = None  # shared: its MPS share's SM ceiling, a fraction
    compute_priority: str | None = None  # shared: normal | low

    @property
    def memory_mib(self) -> int:
        return -(-self.memory_bytes // (1 << 20))


@dataclass(frozen=True)
class WorkloadFile:
    source: str
    workloads: tuple[Workload, ...]


def parse_workloads(text: str, source: str) -> WorkloadFile:
    """Parse a workload file. Raises ConfigError listing every problem with its position."""
    root = compose(text, source, f"'version: {VERSION}' and 'workloads'")
    errors = _Errors(source)
    _check_tags(root, errors, "a workload file")
    if not isinstance(root, yaml.MappingNode):
        errors.add(root, f"the file must be a mapping, not {_kind(root)}")
        errors.raise_if_any()
    top = _fields(root, errors, "the file", ("version", "workloads"))
    if "version" not in top:
        errors.add(root, f"missing 'version: {VERSION}'")
    elif not (isinstance(v := top["version"][1], yaml.ScalarNode) and v.value == VERSION):
        errors.add(v, f"version must be {VERSION}, not {_kind(v)}")
    workloads: list[Workload] = []
    if "workloads" not in top:
        if set(top) <= {"version"}:
            errors.add(root, "missing 'workloads' (a list of workloads)")
    else:
        lnode = top["workloads"][1]
        if not isinstance(lnode, yaml.SequenceNode):
            errors.add(lnode, f"workloads must be a list (- name: ...), not {_kind(lnode)}")
        elif not lnode.value:
            errors.add(lnode, "workloads is an empty list; give at least one workload")
        elif len(lnode.value) > MAX_WORKLOADS:
            errors.add(
                lnode,
                f"workloads has {len(lnode.value)} entries; a node plan takes at most"
                f" {MAX_WORKLOADS}",
            )
        else:
            seen: dict[str, Mark] = {}
            for i, item in enumerate(lnode.value):
                w = _workload(item, errors, f"workload {i + 1}")
                if w is None:
                    continue
                if w.name in seen:
                    assert w.mark is not None
                    errors.add(
                        w.mark, f"workload name {w.name!r} is used twice (first at {seen[w.name]})"
                    )
                    continue
                assert w.mark is not None
                seen[w.name] = w.mark
                workloads.append(w)
    errors.raise_if_any()
    return WorkloadFile(source, tuple(workloads))


def load_workloads(path: str | None) -> WorkloadFile:
    """Read and parse a workload file (`-` reads stdin). Raises ConfigError."""
    if not path:
        raise ConfigError("no workload file: pass -f FILE")
    text = read_config_text(path, "workload file", pipe=True)
    return parse_workloads(text, "<stdin>" if path == "-" else path)


def _fields(node: yaml.Node, errors: _Errors, what: str, allowed: tuple[str, ...]) -> Fields:
    fields = {k.value: (k, v) for k, v in _mapping(node, errors, what)}
    for key, (knode, _) in fields.items():
        if key not in allowed:
            expected = ", ".join(repr(a) for a in allowed)
            errors.add(knode, f"{what}: unknown key {key!r}; expected one of {expected}")
    return fields


def _workload(node: yaml.Node, errors: _Errors, what: str) -> Workload | None:
    if not isinstance(node, yaml.MappingNode):
        errors.add(node, f"{what} must be a mapping (name: ..., memory: ...), not {_kind(node)}")
        return None
    before = len(errors.located)
    name = _name({k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)},
                 node, errors, what)  # fmt: skip
    if name is not None:
        what = f"workload {name!r}"
    fields = _fields(node, errors, what, KEYS)
    replicas = _integer(fields, "replicas", errors, what, 1, MAX_REPLICAS, default=1)
    memory = _memory(fields, node, errors, what)
    isolation = _isolation(fields, node, errors, what)
    priority = _integer(fields, "priority", errors, what, -(10**6), 10**6, default=0)
    compute = _fraction(fields, "compute", errors, what)
    limit = _fraction(fields, "compute-limit", errors, what)
    share_priority = _share_priority(fields, errors, what)
    sms = _integer(fields, "sms", errors, what, 1, 10**4, default=None)
    if "compute" in fields and "sms" in fields:
        errors.add(
            fields["sms"][0],
            f"{what}: give its compute need as 'compute' (a fraction of a GPU) or 'sms', not both",
        )
    for key in ("compute-limit", "compute-priority"):
        if key in fields and isolation not in (None, "shared"):
            errors.add(
                fields[key][0],
                f"{what}: {key} is an MPS share's, for a shared workload; this one is {isolation}",
            )
    if limit is not None and compute is not None and limit < compute:
        errors.add(
            fields["compute-limit"][1],
            f"{what}: compute-limit {limit:g} is below its compute {compute:g}; a limit is a"
            " ceiling at or above the request",
        )
    if len(errors.located) > before or name is None or memory is None or isolation is None:
        return None
    assert replicas is not None and priority is not None
    return Workload(
        name, replicas, memory, isolation, priority, compute, sms, errors.mark(node), limit,
        share_priority,
    )  # fmt: skip


def _name(fields: Fields, node: yaml.Node, errors: _Errors, what: str) -> str | None:
    if "name" not in fields:
        errors.add(node, f"{what}: missing 'name'")
        return None
    vnode = fields["name"][1]
    value = _scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
    if not isinstance(value, str) or not value.strip():
        errors.add(vnode, f"{what}: name must be a text, not {_kind(vnode)}")
        return None
    if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in value) or len(value) > 253:
        # A terminal escape or a bidi override would reach the user's terminal and the plan.
        errors.add(
            vnode, f"{what}: name must be at most 253 printable characters (no control characters)"
        )
        return None
    return value


def _integer(
    fields: Fields, key: str, errors: _Errors, what: str, low: int, high: int, default: int | None
) -> int | None:
    if key not in fields:
        return default
    vnode = fields[key][1]
    value = _scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        errors.add(vnode, f"{what}: {key} must be an integer {low}-{high}, not {_kind(vnode)}")
        return default
    return value


def _memory(fields: Fields, node: yaml.Node, errors: _Errors, what: str) -> int | None:
    if "memory" not in fields:
        errors.add(node, f"{what}: missing 'memory' (a size like 10G or 10240M)")
        return None
    vnode = fields["memory"][1]
    value = _scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
    try:
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ConfigError(f"memory must be a size like 10G or 10240M, not {_kind(vnode)}")
        return parse_size(str(vnode.value), "memory")
    except ConfigError as err:
        errors.add(vnode, f"{what}: {err}")
        return None


def _isolation(fields: Fields, node: yaml.Node, errors: _Errors, what: str) -> str | None:
    if "isolation" not in fields:
        errors.add(node, f"{what}: missing 'isolation' ({', '.join(ISOLATIONS)})")
        return None
    vnode = fields["isolation"][1]
    value = _scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
    if value not in ISOLATIONS:
        errors.add(
            vnode, f"{what}: isolation must be one of {', '.join(ISOLATIONS)}, not {_kind(vnode)}"
        )
        return None
    assert isinstance(value, str)
    return value


def _fraction(fields: Fields, key: str, errors: _Errors, what: str) -> float | None:
    if key not in fields:
        return None
    vnode = fields[key][1]
    value = _scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
        errors.add(
            vnode,
            f"{what}: {key} must be a fraction of a GPU, above 0 and at most 1 (0.25),"
            f" not {_kind(vnode)}",
        )
        return None
    return float(value)


def _share_priority(fields: Fields, errors: _Errors, what: str) -> str | None:
    if "compute-priority" not in fields:
        return None
    vnode = fields["compute-priority"][1]
    value = _scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
    if value not in COMPUTE_PRIORITIES:
        errors.add(
            vnode,
            f"{what}: compute-priority must be one of {', '.join(COMPUTE_PRIORITIES)},"
            f" not {_kind(vnode)}",
        )
        return None
    assert isinstance(value, str)
    return value
