"""A cheaper turn of the worker's event loop (kombu's ``Hub``), installed by the transport
(``engine/transport.py``: ``Transport.register_with_event_loop``; pinned in ``engine/upstream.py``).

A tiny job takes three or four turns of the loop, and on each one kombu and Celery re-register
descriptors that are registered already (or were never): a syscall and a caught error each time.
"""

from __future__ import annotations

TURN_DELAY = 0.001  # seconds: kombu's loop takes a timer due after 0 as one a second away


def add_readers_only_when_missing(loop, cycle, on_readable, kombu_tick) -> None:
    """Replace kombu's per-turn ``kombu_tick`` (which adds a reader for each of its sockets on every turn:
    ``Hub.add`` registers the socket with epoll again and catches the EEXIST) with one that adds a reader only
    for a socket the loop has none for. A new or reconnected socket is registered with epoll by kombu's cycle
    (``MultiChannelPoller._register``) and then gets its reader here, as before; one dropped by a disconnect
    leaves the loop's readers (``Hub.remove``) and comes back so."""
    loop.on_tick.discard(kombu_tick)
    readers, add_reader, cycle_poll_start = loop.readers, loop.add_reader, cycle.on_poll_start

    def on_poll_start():
        cycle_poll_start()
        for fd in cycle.fds:
            if readers.get(fd) != (on_readable, (fd,)):
                add_reader(fd, on_readable, fd)
    loop.on_tick.add(on_poll_start)


def remove_writers_only_if_added(loop) -> None:
    """Celery's prefork pool removes the writer of every idle child's pipe on every turn of the loop
    (``AsynPool._create_write_handlers``: ``on_poll_start``), and kombu's ``Hub.remove_writer`` unregisters the
    pipe from epoll each time, a syscall and a caught ENOENT per pipe and turn. Here a pipe the loop has no
    writer for is left alone: the loop registers a descriptor with epoll only in ``Hub.add``, which also puts
    it in ``writers`` (or ``readers``, which ``remove_writer`` would put back as it was). Once per loop."""
    if getattr(loop, "_gpulayer_remove_writer", False):
        return
    remove_writer = loop.remove_writer

    def remove_writer_if_added(fd):
        if (fd if isinstance(fd, int) else fd.fileno()) in loop.writers:
            remove_writer(fd)
    loop.remove_writer = remove_writer_if_added
    loop._gpulayer_remove_writer = True
