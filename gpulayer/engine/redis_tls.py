"""redis-py's TLS connection with one ``SSLContext`` per process, for every rediss:// client gpulayer builds.

It overrides redis-py 8.1's private ``SSLConnection._wrap_socket_with_ssl`` (pinned in engine/upstream.py).
Importing this module installs it as the connection class of ``store.connection.connect_redis``'s TLS
clients; kombu's transport (engine/transport.py) and Celery's result backend (engine/results.py) name it
themselves, and import it, so every process that loads the Celery app connects through it.
"""

from __future__ import annotations

import os
import ssl
import threading

import redis

from ..store.connection import use_for_tls

_contexts: dict[tuple, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


class TLSConnection(redis.SSLConnection):
    """redis-py's TLS connection, with one ``SSLContext`` per process and options instead of one per connection.

    redis-py builds a context for every connection, loading the system's CA bundle each time (45 ms of CPU
    per connection on a busy machine with OpenSSL 3): that made every job that opens a client, and every
    worker start, several times slower over TLS. The context is built as redis-py builds it, and built
    again when a certificate or key file changes on disk (a rotated certificate takes effect on the next
    connection, as it does in redis-py).
    """

    def _wrap_socket_with_ssl(self, sock):
        if self.ssl_validate_ocsp or self.ssl_validate_ocsp_stapled:  # rare: redis-py's own path, uncached
            return super()._wrap_socket_with_ssl(sock)
        return self._context().wrap_socket(sock, server_hostname=self.host)

    def _context(self) -> ssl.SSLContext:
        files = (self.certfile, self.keyfile, self.ca_certs)
        key = (self.cert_reqs, self.check_hostname, self.ca_path, self.ca_data, self.ssl_min_version,
               self.ssl_ciphers, self.certificate_password,
               tuple(self.ssl_include_verify_flags or ()), tuple(self.ssl_exclude_verify_flags or ()),
               *((f, os.stat(f).st_mtime_ns) if f else None for f in files))
        with _contexts_lock:
            context = _contexts.get(key)
            if context is None:
                context = _contexts[key] = self._build_context()
        return context

    def _build_context(self) -> ssl.SSLContext:
        """The context redis-py 8.1's ``SSLConnection._wrap_socket_with_ssl`` builds."""
        context = ssl.create_default_context()
        context.check_hostname = self.check_hostname
        context.verify_mode = self.cert_reqs
        for flag in self.ssl_include_verify_flags or ():
            context.verify_flags |= flag
        for flag in self.ssl_exclude_verify_flags or ():
            context.verify_flags &= ~flag
        if self.certfile or self.keyfile:
            context.load_cert_chain(certfile=self.certfile, keyfile=self.keyfile,
                                    password=self.certificate_password)
        if self.ca_certs is not None or self.ca_path is not None or self.ca_data is not None:
            context.load_verify_locations(cafile=self.ca_certs, capath=self.ca_path, cadata=self.ca_data)
        if self.ssl_min_version is not None:
            context.minimum_version = self.ssl_min_version
        if self.ssl_ciphers:
            context.set_ciphers(self.ssl_ciphers)
        return context


use_for_tls(TLSConnection)
