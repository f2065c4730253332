"""Whether a Dask scheduler answers at an address, found out in seconds with a plain socket.

``distributed.Client`` on an address where nothing listens retries for its whole timeout, and
on a port where another server listens (an HTTP server) it waits for a handshake that never
comes. A Dask comm endpoint speaks first: on accepting a connection it writes its handshake
(``distributed.comm.core.Listener.on_connection``), a frame of an 8-byte little-endian length
and msgpack that names the ``pickle-protocol``. So: resolve the host, connect, (for ``tls://``)
shake hands, and read that frame, each within the timeout.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time

from lmablate.core.validation import ConfigError

__all__ = ["probe_scheduler"]

DASK_MARK = b"pickle-protocol"  # a key of every Dask handshake
MAX_HANDSHAKE = 1 << 16  # bytes: a handshake is about 100


def _split(address: str) -> tuple[str, str, int]:
    scheme, rest = address.split("://", 1)
    host, _, port = rest.rpartition(":")
    return scheme, host.strip("[]"), int(port)


def _read(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def probe_scheduler(address: str, timeout: float, key: str) -> None:
    """Return when a Dask scheduler (or worker) answers at ``address``
    (``tcp://host:port`` or ``tls://host:port``; websocket addresses are left to Dask);
    otherwise raise within about ``timeout`` seconds, saying what answered.

    ``key`` names where the address came from (``runtime.cluster``, or
    ``LMABLATE_CLUSTER (env)``), for the message.

    Raises:
        ConfigError: a port outside 1..65535, a host that does not resolve, nothing listening
            (refused, or no answer in ``timeout`` s), a TLS mismatch either way, or a server
            that is no Dask scheduler.
    """
    def refuse(why: str) -> ConfigError:
        return ConfigError(f"params: {key}={address!r} is not allowed; {why}")

    scheme, host, port = _split(address)
    if scheme not in ("tcp", "tls"):
        return
    if not 1 <= port <= 65535:
        raise refuse(f"port {port} is outside 1..65535")
    deadline = time.monotonic() + timeout
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise refuse(f"the host {host!r} does not resolve ({exc.strerror})") from None
    family, kind, proto, _, where = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(where)
        except ConnectionRefusedError:
            raise refuse("nothing listens there (connection refused); start the scheduler "
                         f"with dask scheduler --port {port}") from None
        except (socket.timeout, TimeoutError):
            raise refuse(f"nothing answered in {timeout:g} s (a host that is down or a "
                         "firewall); runtime.cluster_timeout sets the wait") from None
        except OSError as exc:
            raise refuse(f"it cannot be reached ({exc.strerror or exc})") from None
        if scheme == "tls":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # only whether TLS is spoken; Dask verifies
            try:
                sock = context.wrap_socket(sock, server_hostname=host)
            except (ssl.SSLError, OSError) as exc:
                raise refuse("the server there does not speak TLS "
                             f"({getattr(exc, 'reason', None) or exc}); a plain scheduler's "
                             f"address is tcp://{host}:{port}") from None
        try:
            head = _read(sock, 8, deadline)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            body = _read(sock, min(size, MAX_HANDSHAKE), deadline) if size else b""
        except (socket.timeout, TimeoutError):
            head, body = b"", b""
        except ssl.SSLError as exc:
            raise refuse(f"a TLS error after the handshake ({exc.reason})") from None
        except OSError as exc:
            raise refuse(f"the connection broke ({exc.strerror or exc})") from None
        if DASK_MARK in body:
            return
        if not head:
            tls = " or a TLS scheduler: its address starts tls://" if scheme == "tcp" else ""
            raise refuse(f"something listens there but sent no Dask handshake in {timeout:g} s: "
                         f"no Dask scheduler (an HTTP server?{tls})")
        raise refuse(f"something answered there that is no Dask scheduler (it sent "
                     f"{(head + body)[:40]!r})")
    finally:
        sock.close()
