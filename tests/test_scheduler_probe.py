"""A cluster address that answers or fails fast (lmablate.execution.scheduler_probe): every kind of
dead address against real local sockets, each refused within about the timeout with what answered;
a real Dask scheduler passes."""

from __future__ import annotations

import http.server
import socket
import struct
import subprocess
import threading
import time

import pytest

from lmablate.config import params
from lmablate.config.study import ConfigError
from lmablate.execution.scheduler_probe import probe_scheduler

from conftest import BIN, tiny_params

TIMEOUT = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_listener():
    """A socket that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _refused(address: str, key: str = "runtime.cluster") -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        probe_scheduler(address, TIMEOUT, key)
    return str(err.value), time.monotonic() - start


def test_a_port_where_nothing_listens_is_refused_at_once():
    port = _free_port()
    message, took = _refused(f"tcp://127.0.0.1:{port}")
    assert message == (f"params: runtime.cluster='tcp://127.0.0.1:{port}' is not allowed; nothing "
                       f"listens there (connection refused); start the scheduler with dask "
                       f"scheduler --port {port}")
    assert took < 1


def test_a_host_that_does_not_resolve_is_refused_naming_it():
    message, took = _refused("tcp://no-such-host.invalid:8786", "LMABLATE_CLUSTER (env)")
    assert message.startswith("params: LMABLATE_CLUSTER (env)='tcp://no-such-host.invalid:8786' "
                              "is not allowed; the host 'no-such-host.invalid' does not resolve (")
    assert took < TIMEOUT + 10  # the resolver's own time; no connection is tried


@pytest.mark.parametrize("server", ["silent_listener", "http_server"])
def test_a_server_that_is_no_dask_scheduler_is_refused_within_the_timeout(server, request):
    port = request.getfixturevalue(server)
    message, took = _refused(f"tcp://127.0.0.1:{port}")
    assert message == (f"params: runtime.cluster='tcp://127.0.0.1:{port}' is not allowed; "
                       f"something listens there but sent no Dask handshake in {TIMEOUT:g} s: no "
                       "Dask scheduler (an HTTP server? or a TLS scheduler: its address starts "
                       "tls://)")
    assert TIMEOUT - 0.1 < took < TIMEOUT + 1


def test_tls_to_a_server_that_speaks_plain_tcp_is_refused_naming_the_plain_address():
    """A plain Dask endpoint writes its handshake at once, which is no TLS reply."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def speak_first():
        conn, _ = server.accept()
        body = b"\x83\xafpickle-protocol\x05"
        conn.sendall(struct.pack("<Q", len(body)) + body)
        time.sleep(TIMEOUT)
        conn.close()

    thread = threading.Thread(target=speak_first, daemon=True)
    thread.start()
    try:
        message, took = _refused(f"tls://127.0.0.1:{port}")
    finally:
        thread.join()
        server.close()
    assert message.startswith(f"params: runtime.cluster='tls://127.0.0.1:{port}' is not allowed; "
                              "the server there does not speak TLS (")
    assert message.endswith(f"); a plain scheduler's address is tcp://127.0.0.1:{port}")
    assert took < TIMEOUT + 1


def test_a_port_past_65535_is_refused_when_params_are_read():
    with pytest.raises(ConfigError, match=r"runtime\.cluster='tcp://127\.0\.0\.1:99999' is not "
                                          r"allowed; .*a port from 1 to 65535"):
        params.parse(tiny_params({"runtime": {"cluster": "tcp://127.0.0.1:99999"}}))


def test_a_real_dask_scheduler_answers_the_probe(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port",
                             str(port), "--no-dashboard"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                probe_scheduler(f"tcp://127.0.0.1:{port}", TIMEOUT, "runtime.cluster")
                break
            except ConfigError as exc:
                assert "connection refused" in str(exc) and time.monotonic() < deadline, exc
                time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
