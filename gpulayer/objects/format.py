"""One file format for every stored object: a signed header, a pickle, and its large buffers laid out raw.

Layout (all integers little-endian)::

    0    MAGIC b"GLOBJ1" + 2 zero bytes
    8    u64 pickle length, u64 buffer count
    24   32-byte HMAC-SHA256 (the cluster secret) of bytes 0..24, the buffer table and the pickle
    56   buffer table: u64 offset, u64 length, u64 kind per buffer (kind: a PickleBuffer, or bytes)
    ...  the pickle (protocol 5, its large buffers out of band)
    ...  each buffer at an offset aligned to ALIGN bytes

Why: a 1 GB tensor is written straight from its own memory to the file (no second copy in memory), and
read back without a copy: ``load`` maps the file copy-on-write and hands pickle slices of the map, so a
tensor or array comes back viewing the mapped pages (writable; a write copies the page, never the file).
The MAC is checked before a byte is unpickled; it covers the pickle and the buffers' lengths, not their
bytes: buffers only ever become numbers, never code.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
import os
import pickle
import struct
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import payload
from ..errors import PayloadRejected

MAGIC = b"GLOBJ1\0\0"
_FIXED = struct.Struct("<8sQQ")  # magic, pickle length, buffer count
_MAC_LEN = 32
_ENTRY = struct.Struct("<QQQ")  # offset, length, kind
HEAD = _FIXED.size + _MAC_LEN  # 56
ALIGN = 64
OUT_OF_BAND = 64 * 1024  # buffers from this size up go out of band; smaller ones stay in the pickle
_ZEROS = bytes(ALIGN)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# -- writing ------------------------------------------------------------------------------------------------

def _rebuild_tensor(buf, dtype: str, shape: tuple, requires_grad: bool, parameter: bool):
    import torch

    kind = getattr(torch, dtype)
    if len(buf) == 0:
        t = torch.empty(shape, dtype=kind)
    else:
        if isinstance(buf, bytes):  # an in-band buffer of a small tensor (pickle hands bytes for read-only ones)
            buf = bytearray(buf)
        t = torch.frombuffer(buf, dtype=torch.uint8).view(kind).view(shape)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_() if requires_grad else t


def _tensor_reduce(t):
    """A CPU tensor as its raw bytes (a view, no copy when contiguous), dtype and shape."""
    import torch

    data = t.detach().resolve_conj().resolve_neg().contiguous()
    raw = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else bytearray()
    return _rebuild_tensor, (pickle.PickleBuffer(raw), str(data.dtype).removeprefix("torch."), tuple(t.shape),
                             bool(t.requires_grad), type(t) is torch.nn.Parameter)


def _plain_tensor(obj) -> bool:
    torch = sys.modules.get("torch")
    if torch is None or type(obj) not in (torch.Tensor, torch.nn.Parameter):
        return False
    return (obj.device.type == "cpu" and obj.layout == torch.strided and not obj.is_quantized
            and (obj.is_leaf or not obj.requires_grad))


class _Pickler(payload._Pickler):
    """payload's pickler (the user's functions by value), with tensors and large bytes out of band.

    ``parts`` collects (kind, view) in file order: kind 0 a PickleBuffer the unpickler takes back by position,
    kind 1 a bytes object named by its index (a persistent id: bytes never reach ``reducer_override``)."""

    def __init__(self, file):
        super().__init__(file, protocol=5, buffer_callback=self._out_of_band)
        self.parts: list[tuple[int, memoryview]] = []
        self._bytes: dict[int, int] = {}
        self._keep: list = []  # the bytes named, alive while pickling (their ids stay theirs)

    def _out_of_band(self, buf: pickle.PickleBuffer):
        view = buf.raw()
        if view.nbytes < OUT_OF_BAND:
            return True  # small: in band
        self.parts.append((PICKLE_BUFFER, view))
        return False

    def reducer_override(self, obj):
        if _plain_tensor(obj):
            return _tensor_reduce(obj)
        if type(obj) is bytearray and len(obj) >= OUT_OF_BAND:
            return bytearray, (pickle.PickleBuffer(obj),)
        return super().reducer_override(obj)

    def persistent_id(self, obj):
        if type(obj) is bytes and len(obj) >= OUT_OF_BAND:
            index = self._bytes.get(id(obj))
            if index is None:
                index = self._bytes[id(obj)] = len(self.parts)
                self.parts.append((BYTES, memoryview(obj)))
                self._keep.append(obj)
            return index
        return None


PICKLE_BUFFER, BYTES = 0, 1


@dataclass
class Prepared:
    """A value pickled and signed, its buffers not yet copied: ``size`` is the file's size before it is written."""

    head: bytes  # fixed part, MAC, buffer table
    body: bytes  # the pickle
    buffers: list = field(default_factory=list)  # memoryviews of the value's own memory
    offsets: list = field(default_factory=list)
    size: int = 0

    def write_to(self, write: Callable[[Any], Any]) -> int:
        """Stream the file through ``write`` (which must take all it is given, as a buffered file does)."""
        write(self.head)
        write(self.body)
        at = len(self.head) + len(self.body)
        for off, buf in zip(self.offsets, self.buffers):
            if off > at:
                write(_ZEROS[: off - at])
            write(buf)
            at = off + buf.nbytes
        return at


def prepare(value: Any, secret: bytes) -> Prepared:
    """Pickle ``value`` with its large buffers out of band (views of its memory, not copies) and sign it."""
    import io

    out = io.BytesIO()
    pickler = _Pickler(out)
    pickler.dump(value)
    body = out.getvalue()
    parts = pickler.parts
    at = HEAD + _ENTRY.size * len(parts) + len(body)
    offsets, entries = [], []
    for kind, view in parts:
        at = _aligned(at)
        offsets.append(at)
        entries.append(_ENTRY.pack(at, view.nbytes, kind))
        at += view.nbytes
    fixed = _FIXED.pack(MAGIC, len(body), len(parts))
    table = b"".join(entries)
    mac = hmac.new(secret, fixed + table + body, hashlib.sha256).digest()
    return Prepared(fixed + mac + table, body, [v for _, v in parts], offsets, at)


def dump(value: Any, write: Callable[[Any], Any], secret: bytes) -> int:
    """Write ``value`` in this format through ``write``; returns the bytes written."""
    return prepare(value, secret).write_to(write)


# -- reading ------------------------------------------------------------------------------------------------

class _Unpickler(pickle.Unpickler):
    def __init__(self, file, buffers, named):
        super().__init__(file, buffers=buffers)
        self._named = named
        self._made: dict = {}  # one bytes object per stored one, however often the value names it

    def persistent_load(self, pid):
        made = self._made.get(pid)
        if made is None:
            try:
                made = self._made[pid] = bytes(self._named[pid])
            except (KeyError, TypeError) as err:
                raise PayloadRejected(f"stored object names buffer {pid!r}, which it does not have") from err
        return made


def check(mapped, secret: bytes, where: str = "object") -> tuple[memoryview, list[tuple[int, int, int]]]:
    """The pickle and the buffer table of a mapped (or in-memory) object file, once its MAC is right."""
    view = memoryview(mapped)
    if view.nbytes < HEAD or bytes(view[:8]) != MAGIC:
        raise PayloadRejected(f"{where} is not a gpulayer object file (no {MAGIC[:6]!r} header); refused "
                              "without unpickling it")
    _, body_len, count = _FIXED.unpack(view[: _FIXED.size])
    table_end = HEAD + _ENTRY.size * count
    if table_end + body_len > view.nbytes:
        raise PayloadRejected(f"{where} is cut short ({view.nbytes} bytes, its header says more); refused")
    table = view[HEAD:table_end]
    body = view[table_end: table_end + body_len]
    mac = hmac.new(secret, view[: _FIXED.size], hashlib.sha256)
    mac.update(table)
    mac.update(body)
    if not hmac.compare_digest(mac.digest(), bytes(view[_FIXED.size: HEAD])):
        raise PayloadRejected(f"{where}: signature does not match the cluster secret (tampered with, or written "
                              "by another cluster); refused without unpickling it")
    entries = [_ENTRY.unpack(table[i: i + _ENTRY.size]) for i in range(0, len(table), _ENTRY.size)]
    for off, length, _ in entries:
        if off + length > view.nbytes:
            raise PayloadRejected(f"{where} is cut short: a buffer ends at {off + length}, the file at "
                                  f"{view.nbytes}; refused")
    return body, entries


def loads(data, secret: bytes, where: str = "object") -> Any:
    """The value in ``data`` (a buffer holding a whole object file: an mmap, bytes); buffers view ``data``."""
    body, entries = check(data, secret, where)
    view = memoryview(data)
    slices = [view[off: off + length] for off, length, _ in entries]
    buffers = [s for s, (_, _, kind) in zip(slices, entries) if kind == PICKLE_BUFFER]
    named = {i: s for i, (s, (_, _, kind)) in enumerate(zip(slices, entries)) if kind == BYTES}
    import io

    return _Unpickler(io.BytesIO(body), buffers, named).load()


def load(path: str | os.PathLike, secret: bytes) -> Any:
    """The value stored at ``path``, its tensors and arrays viewing a copy-on-write map of the file (no copy)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise PayloadRejected(f"{path} is empty: not a gpulayer object file; refused")
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        return loads(mapped, secret, str(path))
    except BaseException:
        _close_quietly(mapped)
        raise


def _close_quietly(mapped: mmap.mmap) -> None:
    try:
        mapped.close()
    except BufferError:  # something still views it: the map goes with the last view
        pass


# -- sizes --------------------------------------------------------------------------------------------------

_SAMPLE = 64  # items of a long container looked at; the rest are taken to be like them
_FIXED_SIZE = {int: 8, float: 8, bool: 1, type(None): 1, complex: 16}


def measure(value: Any, enough: int | None = None, _depth: int = 3) -> int | None:
    """A cheap estimate of ``value``'s stored size in bytes, or None where it cannot be told cheaply.

    Tensors and arrays count their bytes, bytes and strings their length, containers the sum of their items to
    depth 3 (a long one: its first items, scaled to its length). An object of another type is unknown (None:
    pickle it to know), unless the known part alone reaches ``enough``: a tiny job's arguments cost microseconds.
    """
    kind = type(value)
    fixed = _FIXED_SIZE.get(kind)
    if fixed is not None:
        return fixed
    if kind in (bytes, bytearray, str):
        return len(value)
    if kind is memoryview:
        return value.nbytes
    nbytes = _array_bytes(value)
    if nbytes is not None:
        return nbytes
    if kind in (list, tuple, set, frozenset, dict):
        if _depth <= 0:
            return None
        items = list(value.items()) if kind is dict else value
        n = len(items)
        if n == 0:
            return 8
        sample = items[:_SAMPLE] if kind in (list, tuple, dict) else list(_first(value, _SAMPLE))
        total, unknown = 0, False
        for item in sample:
            size = measure(item, enough, _depth - 1) if kind is not dict else _pair(item, enough, _depth - 1)
            if size is None:
                unknown = True
            else:
                total += size
            if enough is not None and total * n // len(sample) >= enough:
                return total * n // len(sample)
        total = total * n // len(sample)
        return None if unknown else total
    return None


def _pair(item, enough, depth) -> int | None:
    k, v = measure(item[0], enough, depth), measure(item[1], enough, depth)
    return None if k is None or v is None else k + v


def _first(items, n):
    for i, item in enumerate(items):
        if i >= n:
            return
        yield item


def _array_bytes(value) -> int | None:
    """Bytes of a tensor or numpy array (neither imported here: a job that uses neither never loads them)."""
    module = type(value).__module__
    if module.startswith("torch"):
        torch = sys.modules["torch"]
        if isinstance(value, torch.Tensor):
            return value.element_size() * value.numel()
    elif module == "numpy":
        nbytes = getattr(value, "nbytes", None)
        return nbytes if isinstance(nbytes, int) else None
    return None


def human(n: int) -> str:
    """``190.7 MiB``: a size as people read it."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def summary(value: Any, size: int) -> str:
    """What a ref shows instead of its bytes: ``Tensor[50000, 1000]:float32 190.7 MiB``, ``dict(3) 1.2 GiB``."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        dtype = str(value.dtype).removeprefix("torch.")
        head = f"{type(value).__name__}[{', '.join(map(str, shape))}]:{dtype}"
    elif isinstance(value, (list, tuple, dict, set, frozenset, bytes, bytearray, str)):
        head = f"{type(value).__name__}({len(value)})"
    else:
        head = type(value).__name__
    return f"{head} {human(size)}"
