"""A command in a pseudo-terminal, as a user's shell runs it (Ctrl-C, progress bars, what a terminal shows)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import threading
from pathlib import Path


class Terminal:
    """A command in a pseudo-terminal of its own, as a user's shell runs it: ^C signals its process group."""

    def __init__(self, argv: list[str], cwd: Path, env: dict, columns: int = 80, rows: int = 24):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))  # as a terminal window
        self.master = master
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=True, preexec_fn=self._take_terminal)
        os.close(slave)
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @staticmethod
    def _take_terminal():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # stdin (the pty) becomes its controlling terminal
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a shell starts it, even if pytest ignores SIGINT

    def _read(self):
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # the command exited: the pty is closed
                return
            if not data:
                return
            self.output += data

    def text(self) -> str:
        """What the command wrote, its lines joined where the terminal wrapped them (rich wraps a dumb
        terminal at 80 columns): words separated by single spaces."""
        return " ".join(self.output.decode(errors="replace").split())

    def plain(self) -> str:
        """``text()`` without the terminal's control sequences (colours, cursor moves of a redrawn bar)."""
        return " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", " ", self.output.decode(errors="replace")).split())

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        os.close(self.master)
