"""A TCP relay on loopback that stands for a network path tests break on purpose: a managed
Redis's one DNS name, repointed at a failover (`retarget`), or a replica's link to its
primary, held (`pause`) so that the replica falls behind."""

from __future__ import annotations

import contextlib
import socket
import threading

from devstack.processes import free_port


class Relay:
    """Accepts on its own port and forwards each connection to the target's port at the time
    it was accepted; connections already open keep their target, as a client's sockets keep
    the address a DNS name had when they connected."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target = target_port
        self._flowing = threading.Event()
        self._flowing.set()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def retarget(self, port: int) -> None:
        """New connections go to `port` from now on."""
        self._target = port

    def pause(self) -> None:
        """Hold every byte in both directions (the path is slow, not broken) until `resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._stopped = True
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._server.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):  # as Redis's own sockets: no Nagle delay on small writes
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                if self._stopped:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
