"""testkit.processes' port picker: below the kernel's ephemeral range, clear of the ports tests fix, a share per worker,
no port handed out twice, a bound port passed over."""

import socket
from pathlib import Path

import pytest

from testkit import spark_cluster
from testkit.harness import Cluster
from testkit.processes import PORT_RANGE, PortPicker, bindable
from testkit.workers import WORKER_COUNT_VARIABLE, WORKER_VARIABLE


def test_the_range_is_below_the_kernels_ephemeral_range():
    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert PORT_RANGE.stop <= low


def test_the_range_holds_none_of_the_ports_tests_fix():
    fixed = {
        spark_cluster.MASTER_PORT,
        spark_cluster.MASTER_UI,
        spark_cluster.DRIVER_PORT,
        spark_cluster.BLOCK_PORT,
        spark_cluster.WORKER_PORTS,
        spark_cluster.WORKER_PORTS + 1,
        Cluster.port,
        25672,  # RabbitMQ's distribution port
    }
    assert not fixed & set(PORT_RANGE)


def test_each_worker_walks_a_share_of_its_own(monkeypatch):
    monkeypatch.delenv(WORKER_VARIABLE, raising=False)
    assert PortPicker().share() == PORT_RANGE
    monkeypatch.setenv(WORKER_COUNT_VARIABLE, "3")
    shares = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv(WORKER_VARIABLE, worker)
        shares.append(set(PortPicker().share()))
    assert all(len(share) == len(PORT_RANGE) // 3 for share in shares)
    assert not (shares[0] & shares[1] or shares[1] & shares[2] or shares[0] & shares[2])
    assert set().union(*shares) <= set(PORT_RANGE)


@pytest.fixture
def own_ports(monkeypatch):
    """This worker's share of the range, which no other worker picks from; the pickers made from it below treat it
    as the whole range (no worker id)."""
    share = PortPicker().share()
    monkeypatch.delenv(WORKER_VARIABLE, raising=False)
    return share


def test_no_port_is_handed_out_twice_and_each_is_free(own_ports):
    picker = PortPicker(own_ports)
    ports = [picker.take() for _ in range(300)]
    assert len(set(ports)) == 300
    assert all(port in own_ports and bindable(port) for port in ports)


def test_a_run_of_ports_is_consecutive_free_and_never_split_by_the_wrap(own_ports):
    last = own_ports[-10:]
    picker = PortPicker(last)
    picker.next = last.stop - 2  # two left before the end: a run of three starts over from the beginning
    assert picker.take(3) == last.start
    assert picker.take(3) == last.start + 3


def test_a_bound_port_is_passed_over_and_a_range_with_none_free_says_so(own_ports):
    first = PortPicker(own_ports).take(2)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", first))
        picker = PortPicker(range(first, first + 2))
        picker.next = first
        assert picker.take() == first + 1
        with pytest.raises(RuntimeError, match=f"no 2 consecutive free ports in {first}-{first + 1}"):
            picker.take(2)
