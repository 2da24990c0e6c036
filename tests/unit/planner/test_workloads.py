"""The workload file: what parses, defaults, and a corpus of bad files each with one clear error
at its position; every error of a file at once."""

from __future__ import annotations

import contextlib

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.base.errors import ConfigError
from nodeagent.planner.workloads import KEYS, Workload, load_workloads, parse_workloads

GOOD = """\
version: nodeagent/v1
workloads:
  - name: llm
    replicas: 4
    memory: 38G
    isolation: mig
    priority: 10
    sms: 60
  - {name: asr, memory: 10240M, isolation: shared, compute: 0.25}
  - {name: trainer, memory: 120GiB, isolation: exclusive, priority: -1}
"""


def test_good_file_parses_with_defaults() -> None:
    wf = parse_workloads(GOOD, "w.yaml")
    llm, asr, trainer = wf.workloads
    assert (llm.name, llm.replicas, llm.memory_bytes, llm.isolation) == ("llm", 4, 38 << 30, "mig")
    assert (llm.priority, llm.sms, llm.compute) == (10, 60, None)
    assert (asr.replicas, asr.priority, asr.compute, asr.memory_mib) == (1, 0, 0.25, 10240)
    assert trainer.memory_bytes == 120 << 30 and trainer.priority == -1
    assert str(llm.mark) == "w.yaml:3:5" and str(asr.mark) == "w.yaml:9:5"


def test_load_reads_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "w.yaml"
    path.write_text(GOOD)
    assert [w.name for w in load_workloads(str(path)).workloads] == ["llm", "asr", "trainer"]
    with pytest.raises(ConfigError, match="cannot read workload file"):
        load_workloads(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="no workload file"):
        load_workloads(None)


def _w(body: str) -> str:
    return "version: nodeagent/v1\nworkloads:\n  - " + body + "\n"


# (case id, file text, words that must appear in the one error, "line:col" it must name)
BAD = [
    ("not-yaml", "version: nodeagent/v1\nworkloads: [\n", "not valid YAML", "3:1"),
    ("empty-file", "", "the file is empty", None),
    ("not-a-mapping", "- a\n", "the file must be a mapping", "1:1"),
    ("custom-tag", _w("{name: a, memory: !big 10G, isolation: mig}"), "tag '!big' is not allowed in a workload file", "3:23"),
    ("missing-version", "workloads: [{name: a, memory: 1G, isolation: mig}]\n", "missing 'version", "1:1"),
    ("wrong-version", "version: v1\nworkloads: [{name: a, memory: 1G, isolation: mig}]\n", "version must be nodeagent/v1", "1:10"),
    ("unknown-top-key", "version: nodeagent/v1\nworkload: []\n", "unknown key 'workload'", "2:1"),
    ("missing-workloads", "version: nodeagent/v1\n", "missing 'workloads'", "1:1"),
    ("workloads-empty", "version: nodeagent/v1\nworkloads: []\n", "workloads is an empty list", "2:12"),
    ("workloads-mapping", "version: nodeagent/v1\nworkloads: {a: 1}\n", "workloads must be a list", "2:12"),
    ("item-not-mapping", _w("llm"), "workload 1 must be a mapping", "3:5"),
    ("missing-name", _w("{memory: 1G, isolation: mig}"), "workload 1: missing 'name'", "3:5"),
    ("name-number", _w("{name: 3, memory: 1G, isolation: mig}"), "name must be a text, not int", "3:12"),
    ("name-escape", _w('{name: "x\\e[31mred", memory: 1G, isolation: mig}'), "no control characters", "3:12"),
    ("name-bidi", _w('{name: "a\\u202eb", memory: 1G, isolation: mig}'), "no control characters", "3:12"),
    ("unknown-key", _w("{name: a, memory: 1G, isolation: mig, gpus: 2}"), "workload 'a': unknown key 'gpus'", "3:43"),
    ("missing-memory", _w("{name: a, isolation: mig}"), "workload 'a': missing 'memory'", "3:5"),
    ("memory-bad", _w("{name: a, memory: lots, isolation: mig}"), "memory 'lots' is not a size", "3:23"),
    ("memory-zero", _w("{name: a, memory: 0G, isolation: mig}"), "is not a size", "3:23"),
    ("memory-list", _w("{name: a, memory: [1G], isolation: mig}"), "memory must be a size", "3:23"),
    ("missing-isolation", _w("{name: a, memory: 1G}"), "missing 'isolation' (mig, shared, exclusive)", "3:5"),
    ("isolation-bad", _w("{name: a, memory: 1G, isolation: mps}"), "isolation must be one of mig, shared, exclusive, not str 'mps'", "3:38"),
    ("replicas-zero", _w("{name: a, memory: 1G, isolation: mig, replicas: 0}"), "replicas must be an integer 1-4096", "3:53"),
    ("replicas-str", _w("{name: a, memory: 1G, isolation: mig, replicas: '2'}"), "not str '2'", "3:53"),
    ("replicas-bool", _w("{name: a, memory: 1G, isolation: mig, replicas: true}"), "not bool", "3:53"),
    ("priority-float", _w("{name: a, memory: 1G, isolation: mig, priority: 1.5}"), "priority must be an integer", "3:53"),
    ("compute-zero", _w("{name: a, memory: 1G, isolation: shared, compute: 0}"), "compute must be a fraction of a GPU", "3:55"),
    ("compute-big", _w("{name: a, memory: 1G, isolation: shared, compute: 1.5}"), "at most 1", "3:55"),
    ("compute-nan", _w("{name: a, memory: 1G, isolation: shared, compute: .nan}"), "compute must be a fraction", "3:55"),
    ("compute-text", _w("{name: a, memory: 1G, isolation: shared, compute: half}"), "not str 'half'", "3:55"),
    ("sms-zero", _w("{name: a, memory: 1G, isolation: mig, sms: 0}"), "sms must be an integer 1-10000", "3:48"),
    ("compute-and-sms", _w("{name: a, memory: 1G, isolation: mig, compute: 0.5, sms: 3}"), "not both", "3:57"),
    ("duplicate-key", _w("{name: a, name: b, memory: 1G, isolation: mig}"), "has key 'name' twice", "3:15"),
    ("limit-on-mig", _w("{name: a, memory: 1G, isolation: mig, compute-limit: 0.5}"), "compute-limit is an MPS share's, for a shared workload; this one is mig", "3:43"),
    ("priority-on-exclusive", _w("{name: a, memory: 1G, isolation: exclusive, compute-priority: low}"), "compute-priority is an MPS share's, for a shared workload; this one is exclusive", "3:49"),
    ("limit-below-compute", _w("{name: a, memory: 1G, isolation: shared, compute: 0.5, compute-limit: 0.4}"), "compute-limit 0.4 is below its compute 0.5; a limit is a ceiling at or above the request", "3:75"),
    ("limit-big", _w("{name: a, memory: 1G, isolation: shared, compute-limit: 1.5}"), "compute-limit must be a fraction of a GPU, above 0 and at most 1", "3:61"),
    ("share-priority-bad", _w("{name: a, memory: 1G, isolation: shared, compute-priority: high}"), "compute-priority must be one of normal, low, not str 'high'", "3:64"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "words", "where"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_file_gives_one_clear_error(text: str, words: str, where: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        parse_workloads(text, "w.yaml")
    message = str(info.value)
    assert "errors:" not in message, message  # exactly one error
    assert words in message, message
    assert message.startswith(f"w.yaml:{where}: " if where else "w.yaml: "), message


def test_duplicate_names_name_the_first() -> None:
    text = _w("{name: a, memory: 1G, isolation: mig}\n  - {name: a, memory: 2G, isolation: mig}")
    with pytest.raises(ConfigError) as info:
        parse_workloads(text, "w.yaml")
    assert str(info.value) == "w.yaml:4:5: workload name 'a' is used twice (first at w.yaml:3:5)"


def test_all_errors_of_a_file_are_reported_at_once() -> None:
    text = (
        "version: nodeagent/v1\nworkloads:\n"
        "  - {name: a, memory: 1G, isolation: mps}\n"
        "  - {name: b, isolation: mig, replicas: 0}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_workloads(text, "w.yaml")
    lines = str(info.value).splitlines()
    assert lines[0] == "w.yaml has 3 errors:"
    assert [line.split(": ")[0].strip() for line in lines[1:]] == [
        "w.yaml:3:38",
        "w.yaml:4:5",
        "w.yaml:4:41",
    ]


def test_workload_is_a_value() -> None:
    w = Workload("a", 1, 1 << 30, "mig")
    assert w.memory_mib == 1024 and w.priority == 0


def test_too_many_workloads_is_one_error() -> None:
    body = "".join(f"  - {{name: w{i}, memory: 1G, isolation: mig}}\n" for i in range(257))
    with pytest.raises(ConfigError) as info:
        parse_workloads("version: nodeagent/v1\nworkloads:\n" + body, "w.yaml")
    assert str(info.value) == "w.yaml:3:3: workloads has 257 entries; a node plan takes at most 256"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=1024))
def test_parser_on_arbitrary_bytes(data: bytes) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # decoding is read_config_text's job
    with contextlib.suppress(ConfigError):
        parse_workloads(text, "fuzz.yaml")


LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
    st.sampled_from(["mig", "shared", "exclusive", "10G", "nodeagent/v1", "0.5"]),
)  # fmt: skip
TREES = st.recursive(
    LEAVES,
    lambda c: st.one_of(
        st.lists(c, max_size=4),
        st.dictionaries(st.sampled_from([*KEYS, "version", "workloads", "x"]), c, max_size=5),
    ),
    max_leaves=25,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"version": st.just("nodeagent/v1"), "workloads": st.lists(TREES, max_size=4)}
    )
)
def test_parser_on_arbitrary_trees(tree: object) -> None:
    with contextlib.suppress(ConfigError):
        wf = parse_workloads(yaml.safe_dump(tree), "fuzz.yaml")
        assert all(w.replicas >= 1 and w.memory_bytes > 0 for w in wf.workloads)
