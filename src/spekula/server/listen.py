"""The listening socket: bound before the models load, so a taken port is a clear error at once."""

from __future__ import annotations

import socket

from spekula.errors import ConfigError


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, so a taken port is a clear error before the models load."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port or --host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
