"""Sum tensors across the processes of one machine through shared memory instead of gloo's loopback TCP.

Every process writes its tensor into its own slot of one shared file in
``/dev/shm``; after a barrier each sums all slots (small tensors, or two
processes), or one chunk of them into a shared result that every process copies
back after a second barrier (big tensors: the summing is shared out). The
barrier is one byte per peer through named pipes: the ``write``/``read`` system
calls also order the memory writes before them, and a waiting process sleeps in
``read`` instead of spinning on a core its peers need. Every rank gets the same
sum, in the same order, so replicas stay bit-identical.

The files are unlinked as soon as every process has opened them, so nothing is
left in ``/dev/shm`` after a crash. ``create`` returns None on every rank (and
the caller keeps gloo) when any rank cannot map the leader's file, e.g. when the
ranks that claim to share a machine do not.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

_ALIGN = 64          # slot offsets, so a slot viewed as any dtype is aligned
_HEADER = _ALIGN     # a token the leader writes, proving the others mapped the same file
MAX_SLOT_BYTES = 32 << 20  # bigger tensors go through in pieces of this size
SPIN_S = 200e-6             # how long a barrier polls before it sleeps
FULL_SUM_BYTES = 4 << 20    # up to this much data in all slots, every rank sums everything (one barrier)


_WHERE_BYTES = 4096  # the leader's directory and token, broadcast as bytes


def _broadcast_where(where: tuple[str, int] | None, src: int, group: Any) -> tuple[str, int] | None:
    """The leader's (directory, token) to every rank, as a byte tensor: ``broadcast_object_list``
    needs numpy, which a plain install may lack ("RuntimeError: Numpy is not available")."""
    buf = torch.zeros(_WHERE_BYTES, dtype=torch.uint8)
    if where is not None:
        raw = f"{where[0]}\n{where[1]}".encode()
        if len(raw) < _WHERE_BYTES:
            buf[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    dist.broadcast(buf, src=src, group=group)
    raw = bytes(buf.tolist()).rstrip(b"\0")
    if not raw:
        return None
    d, token = raw.decode().rsplit("\n", 1)
    return d, int(token)


def _round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class ShmReducer:
    """``all_reduce_(t)``: ``t`` becomes the sum of every local process's ``t`` (same shape and dtype everywhere).

    Collective like a process group: every process of the machine calls it with
    the same sequence of shapes, in the same order.
    """

    def __init__(self, buf: torch.Tensor, fds: list[int], rank: int, size: int, slot_bytes: int, timeout_s: float):
        self._buf, self._fds, self.rank, self.size = buf, fds, rank, size
        self.slot_bytes, self.timeout_s = slot_bytes, timeout_s
        self._early = [0] * size  # barrier bytes already read for a later barrier, per sender
        self._parity = 0
        self._poll = select.poll()
        self._poll.register(fds[rank], select.POLLIN)

    @classmethod
    def create(cls, group: Any, group_ranks: list[int], slot_bytes: int, timeout_s: float = 1800.0) -> "ShmReducer | None":
        """Collective over ``group`` (whose global ranks are ``group_ranks``, leader first); None where unavailable."""
        rank = group_ranks.index(dist.get_rank())
        size = len(group_ranks)
        slot_bytes = _round_up(max(1, min(slot_bytes, MAX_SLOT_BYTES)))
        nbytes = _HEADER + (2 * size + 1) * slot_bytes
        where = [None]
        if rank == 0:
            try:
                base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
                d = tempfile.mkdtemp(prefix="gpulayer-shm-", dir=base)
                token = secrets.randbits(62)
                with open(os.path.join(d, "data"), "wb") as f:
                    f.truncate(nbytes)
                buf = torch.from_file(os.path.join(d, "data"), shared=True, size=nbytes, dtype=torch.uint8)
                buf[:8].view(torch.int64)[0] = token
                for r in range(size):
                    os.mkfifo(os.path.join(d, f"barrier{r}"))
                where = [(d, token)]
            except OSError:
                where = [None]
        where = [_broadcast_where(where[0], group_ranks[0], group)]
        reducer, ok = None, False
        if where[0] is not None:
            d, token = where[0]
            fds: list[int] = []
            try:
                buf = torch.from_file(os.path.join(d, "data"), shared=True, size=nbytes, dtype=torch.uint8)
                # O_RDWR: a FIFO opened this way never blocks in open and never sees EOF (Linux)
                fds = [os.open(os.path.join(d, f"barrier{r}"), os.O_RDWR) for r in range(size)]
                ok = int(buf[:8].view(torch.int64)[0]) == token
                reducer = cls(buf, fds, rank, size, slot_bytes, timeout_s)
            except (OSError, RuntimeError):
                for fd in fds:
                    os.close(fd)
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # over the world: every rank takes the same path
        if rank == 0 and where[0] is not None:
            shutil.rmtree(where[0][0], ignore_errors=True)  # mapped and opened everywhere (or given up): unlink
        if not bool(flag.item()):
            if reducer is not None:
                reducer.close()
            return None
        return reducer

    # -- the collective --------------------------------------------------------------------------
    def all_reduce_(self, tensor: torch.Tensor, between: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Sum ``tensor`` over the machine in place; ``between`` runs on the leader with the machine's sum
        before the others read it (the cross-machine step of a two-level sync)."""
        flat = tensor.view(-1)
        per_piece = self.slot_bytes // flat.element_size()
        for lo in range(0, flat.numel(), per_piece):
            self._reduce_piece(flat[lo:lo + per_piece], between)
        return tensor

    def _reduce_piece(self, piece: torch.Tensor, between: Callable[[torch.Tensor], None] | None) -> None:
        n, size = piece.numel(), self.size
        nbytes = n * piece.element_size()
        # two sets of slots, used in turn: a fast rank writes the next call's slot while a slow one still reads
        # this call's (it cannot get two calls ahead: it would have to pass a barrier the slow one has not reached)
        first = _HEADER + self._parity * size * self.slot_bytes
        self._parity ^= 1
        slots = self._buf[first:first + size * self.slot_bytes].view(size, self.slot_bytes)
        slots = slots[:, :nbytes].view(piece.dtype)                       # (size, n)
        slots[self.rank].copy_(piece)
        self._barrier()
        if between is None and (size == 2 or size * nbytes <= FULL_SUM_BYTES):
            torch.sum(slots, dim=0, out=piece)  # small: every rank sums it all, one barrier per call
            return
        start = _HEADER + 2 * size * self.slot_bytes
        result = self._buf[start:start + nbytes].view(piece.dtype)       # (n,)
        lo, hi = self.rank * n // size, (self.rank + 1) * n // size
        if hi > lo:
            torch.sum(slots[:, lo:hi], dim=0, out=result[lo:hi])
        self._barrier()
        if between is not None:
            if self.rank == 0:
                between(result)
            self._barrier()
        piece.copy_(result)
        # the result is rewritten only after the next call's first barrier, which every rank reaches
        # after copying this one out

    def _barrier(self) -> None:
        me = bytes([self.rank])
        for r, fd in enumerate(self._fds):
            if r != self.rank:
                os.write(fd, me)
        got = [r == self.rank for r in range(self.size)]
        for r in range(self.size):  # a byte that arrived during the previous barrier is for this one
            if self._early[r]:
                self._early[r] -= 1
                got[r] = True
        waiting = got.count(False)
        fd = self._fds[self.rank]
        spin_until = time.perf_counter() + SPIN_S
        while waiting:
            # peers usually arrive within microseconds: poll without sleeping first, because a write that
            # must wake a sleeping reader costs far more (a context switch on each side) than the wait
            if not self._poll.poll(0):
                if time.perf_counter() < spin_until:
                    os.sched_yield()
                    continue
                if not self._poll.poll(self.timeout_s * 1000):
                    raise TimeoutError(
                        f"shared-memory gradient sync: rank {self.rank} of this machine waited {self.timeout_s:.0f} s "
                        "for its peers; one of them died or hangs (grad_sync='flat' uses gloo's all-reduce instead)"
                    )
            # each sender writes one byte per barrier, in order: its first byte is for this barrier,
            # a second one (it passed this barrier already and reached the next) is kept for later
            for b in os.read(fd, 4096):
                if got[b]:
                    self._early[b] += 1
                else:
                    got[b] = True
                    waiting -= 1

    def close(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        self._buf = torch.empty(0, dtype=torch.uint8)
