"""An elastic ring's start-up gates belong to one horovodrun job (issue 52, item 2).

A plain ``horovodrun --elastic`` reusing a run directory does not clear the gates the last job
left in its status directory, and Horovod picks the rendezvous port at random, so a new job can
get the port of an earlier one. Its ranks must not take that job's gates for open: they would
reach the PS while rank 0 still creates the tables. The driver's rendezvous store here is
Horovod's own HTTP server, bound to the same port twice as two jobs would."""
from __future__ import annotations

import socket
import threading

import pytest
from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

from gmeta_tf.train.elastic import start_gate


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Driver:
    """A horovodrun driver's rendezvous store: Horovod's server on ``port``, for one job."""

    def __init__(self, port: int):
        self.httpd = RendezvousHTTPServer(("", port), RendezvousHandler, False)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def _env(port: int, rank: int) -> dict:
    return {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_RANK": str(rank)}


def _waiter(gate, name: str, rank: int, order: list) -> threading.Thread:
    t = threading.Thread(target=lambda: gate.rank0_first(rank, name, lambda: order.append(rank)), daemon=True)
    t.start()
    return t


def test_a_gate_an_earlier_job_left_on_the_same_port_does_not_let_the_new_jobs_ranks_pass(tmp_path):
    status, port = str(tmp_path / "status"), _free_port()
    first = _Driver(port)
    try:
        start_gate(_env(port, 0), status).rank0_first(0, "tables-created", lambda: None)  # the last job's rank 0
    finally:
        first.stop()

    second = _Driver(port)  # the next job, same run directory, same port by chance
    try:
        rank1 = start_gate(_env(port, 1), status)  # a rank may start before the new rank 0 does
        rank0 = start_gate(_env(port, 0), status)
        order: list = []
        waiting = _waiter(rank1, "tables-created", 1, order)
        waiting.join(0.5)
        assert waiting.is_alive() and order == [], "rank 1 passed the earlier job's gate"
        rank0.rank0_first(0, "tables-created", lambda: order.append(0))
        waiting.join(10)
        assert order == [0, 1]

        # the driver re-forms the ring (a lost worker) and empties its store; a joiner waits until
        # rank 0 of the new ring put the job's nonce back, then finds the open gate at once
        second.httpd.init([])
        joiner = start_gate(_env(port, 2), status)
        joined: list = []
        t = _waiter(joiner, "tables-created", 2, joined)
        t.join(0.5)
        assert t.is_alive() and joined == []
        rank0.after_reset(0)
        t.join(10)
        assert joined == [2]
    finally:
        second.stop()


def test_without_a_driver_to_ask_the_gate_is_read_by_name_as_before(tmp_path):
    gate = start_gate(_env(_free_port(), 0), str(tmp_path))  # nothing listens there
    assert gate.nonce is None
    gate.rank0_first(0, "ps-connected", lambda: None)
    assert gate.is_open("ps-connected")


@pytest.mark.parametrize("content", ["{not json", '{"pid": 1}'])
def test_a_half_written_or_unstamped_gate_is_not_open_for_a_job_with_a_nonce(tmp_path, content):
    port = _free_port()
    driver = _Driver(port)
    try:
        gate = start_gate(_env(port, 1), str(tmp_path))
        (tmp_path / gate.path("ps-connected").rsplit("/", 1)[1]).write_text(content)
        start_gate(_env(port, 0), str(tmp_path))  # rank 0 published this job's nonce
        assert not gate.is_open("ps-connected")
    finally:
        driver.stop()
