"""The fake MPS control daemon's one-server behaviour, as the real one showed it on an H200
(issue 38; ../shared/fixtures/mps/h200-control-protocol.md): clients of one user share one
server, a client's limits can only lower the daemon's defaults, a client of another user waits
silently until the server's clients have gone and then gets a server of its own, and a server
or daemon that goes hangs its clients up."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.mps.control import parent_pid, process_alive
from tests.support.fake_mps.clients import FakeMpsClient, FakeMpsDaemon
from tests.support.wait import wait_for

ME = os.getuid()
OTHER = ME + 1000


@pytest.fixture
def daemon(fake_mps_control: str) -> Iterator[FakeMpsDaemon]:
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))  # unix socket paths are short
    d = FakeMpsDaemon(fake_mps_control, root)
    yield d
    d.quit()


@pytest.fixture
def clients() -> Iterator[list[FakeMpsClient]]:
    started: list[FakeMpsClient] = []
    yield started
    for c in started:
        c.stop()


def _client(
    daemon: FakeMpsDaemon, started: list[FakeMpsClient], uid: int | None = None, **env: str
) -> FakeMpsClient:
    c = FakeMpsClient(daemon.env(**env), uid=uid)
    started.append(c)
    return c


def test_clients_of_one_user_share_one_server_with_their_own_limits(
    daemon: FakeMpsDaemon, clients: list[FakeMpsClient]
) -> None:
    daemon.start()
    assert daemon.command("set_default_active_thread_percentage 50") == "50.0"
    daemon.command("set_default_device_pinned_mem_limit 0 8G")
    assert daemon.servers() == []  # no client yet: no server
    asked = [("25", "0=4G"), ("40", "0=2048M"), ("50", "")]
    got = []
    for pct, mem in asked:
        env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": pct}
        if mem:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = mem
        got.append(_client(daemon, clients, **env).answer())
    (server,) = daemon.servers()
    assert {a["server"] for a in got} == {server} and parent_pid(server) == daemon.pid()
    assert [a["active_thread_percentage"] for a in got] == ["25.0", "40.0", "50.0"]
    assert [a["pinned_device_mem_limit"] for a in got] == [{"0": "4G"}, {"0": "2G"}, {"0": "8G"}]
    assert sorted(daemon.clients(server)) == sorted(c.pid for c in clients)
    assert daemon.command(f"get_active_thread_percentage {server}") == "50.0"
    assert daemon.command(f"get_device_pinned_mem_limit {server} 0") == "8G"
    assert daemon.command("get_client_list 1") == "Server 1 not found"
    log = daemon.log()
    first, second = clients[0].pid, clients[1].pid
    assert f"NEW CLIENT {first} from user {ME}: Server is not ready, push client to pending list" in log  # fmt: skip
    assert f"Starting new server {server} for user {ME}" in log
    assert f"NEW SERVER {server}: Ready" in log
    assert f"NEW CLIENT {second} from user {ME}: Server already exists" in log


PCT, MEM = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


@pytest.mark.parametrize(
    ("given", "rewritten", "expected"),
    [
        ({}, {}, ("25.0", {"0": "4G"})),
        ({PCT: "20", MEM: "0=2G"}, {}, ("20.0", {"0": "2G"})),
        ({PCT: "20", MEM: "0=2G"}, {PCT: "100", MEM: "0=16G"}, ("25.0", {"0": "4G"})),
        ({PCT: "20", MEM: "0=2G"}, {PCT: "10"}, ("10.0", {"0": "2G"})),
        ({PCT: "lots", MEM: "0=lots"}, {}, ("25.0", {"0": "4G"})),
    ],
)
def test_a_clients_limits_are_the_lower_of_its_own_and_the_defaults(
    daemon: FakeMpsDaemon,
    clients: list[FakeMpsClient],
    given: dict[str, str],
    rewritten: dict[str, str],
    expected: tuple[str, dict[str, str]],
) -> None:
    """Defaults 25 % / 4G: a client asking for 100 % / 16G got 32 SMs and 3 GiB on the H200.
    `given` is its container's environment, `rewritten` what it sets itself before it starts."""
    daemon.start()
    daemon.command("set_default_active_thread_percentage 25")
    daemon.command("set_default_device_pinned_mem_limit 0 4G")
    c = FakeMpsClient(daemon.env(**given), ask=rewritten)
    clients.append(c)
    got = c.answer()
    assert (got["active_thread_percentage"], got["pinned_device_mem_limit"]) == expected


def test_another_users_client_waits_silently_then_gets_a_server_of_its_own(
    daemon: FakeMpsDaemon, clients: list[FakeMpsClient]
) -> None:
    daemon.start()
    a1, a2 = _client(daemon, clients), _client(daemon, clients)
    (first,) = {a1.answer()["server"], a2.answer()["server"]}
    b = _client(daemon, clients, uid=OTHER)
    daemon.wait_log(
        f"NEW CLIENT {b.pid} from user {OTHER}: Server is not ready, push client to pending list"
    )
    assert b.waiting()  # no answer, no error: a silent stall
    assert daemon.servers() == [first] and sorted(daemon.clients(first)) == sorted([a1.pid, a2.pid])

    assert a1.stop() == 0
    assert b.waiting()  # one of the first user's clients is still there
    assert a2.stop() == 0
    got = b.answer()
    assert got["user"] == OTHER and got["server"] != first
    assert daemon.servers() == [got["server"]] and daemon.clients(got["server"]) == [b.pid]
    log = daemon.log()
    assert f"Server {first} exited with status 0" in log
    assert f"Starting new server {got['server']} for user {OTHER}" in log
    assert not process_alive(first)


def test_an_idle_server_of_another_user_is_replaced_at_once(
    daemon: FakeMpsDaemon, clients: list[FakeMpsClient]
) -> None:
    daemon.start()
    a = _client(daemon, clients)
    first = a.answer()["server"]
    a.stop()
    assert daemon.servers() == [first]  # an idle server stays
    got = _client(daemon, clients, uid=OTHER).answer()
    assert got["server"] != first and got["user"] == OTHER


def test_a_killed_server_hangs_its_clients_up_and_the_next_client_gets_a_new_one(
    daemon: FakeMpsDaemon, clients: list[FakeMpsClient]
) -> None:
    daemon.start()
    a = _client(daemon, clients)
    server = a.answer()["server"]
    os.kill(server, signal.SIGKILL)
    assert a.wait() == 1 and "lost the MPS server" in a.stderr()
    daemon.wait_log(f"Server {server} exited with status 137")
    assert daemon.servers() == []
    again = _client(daemon, clients).answer()["server"]
    assert again != server and daemon.servers() == [again]


def test_a_killed_daemon_hangs_its_clients_up_and_takes_its_server_along(
    daemon: FakeMpsDaemon, clients: list[FakeMpsClient]
) -> None:
    daemon.start()
    a = _client(daemon, clients)
    server = a.answer()["server"]  # a's server first: else b's user could have it (a race)
    b = _client(daemon, clients, uid=OTHER)
    daemon.wait_log(f"NEW CLIENT {b.pid} from user {OTHER}")
    os.kill(daemon.pid(), signal.SIGKILL)
    assert a.wait() == 1 and b.wait() == 1  # the waiting one too
    wait_for(lambda: not process_alive(server), "the server gone with its daemon", 10)
    assert daemon.command("get_server_list") == "Cannot find MPS control daemon process"
    daemon.start()  # over the stale pipe directory, as the real one does
    assert _client(daemon, clients).answer()["server"] not in (None, server)


def test_quit_hangs_up_clients_and_ends_the_server(
    daemon: FakeMpsDaemon, clients: list[FakeMpsClient]
) -> None:
    daemon.start()
    a = _client(daemon, clients)
    server = a.answer()["server"]
    daemon.quit()
    assert a.wait() == 1
    assert not process_alive(server)
    assert f"Server {server} exited with status 0" in daemon.log()


def test_a_client_without_a_daemon_runs_without_mps(
    daemon: FakeMpsDaemon, clients: list[FakeMpsClient]
) -> None:
    got = _client(daemon, clients).answer()
    assert got["server"] is None


def test_the_phantom_server_keeps_its_client(
    daemon: FakeMpsDaemon, clients: list[FakeMpsClient]
) -> None:
    """FAKE_MPS_SERVER=1 (tests of the agent's status): its server and client 4242 stay, and a
    real client joins them."""
    daemon.start(FAKE_MPS_SERVER="1")
    (server,) = daemon.servers()
    assert daemon.clients(server) == [4242]
    c = _client(daemon, clients)
    assert c.answer()["server"] == server
    assert daemon.clients(server) == [4242, c.pid]
