"""A job's kept lines (its tail: the newest, bounded by ``lines.TAIL_LINES`` and ``lines.TAIL_BYTES``), read back.

``handle.logs()``, ``gang_handle.logs(rank=R)``, `gpulayer logs ID [-f] [--rank R]` and Flower's task page
read them here. A tail lives as long as its job's result; a job that printed nothing has none.
"""

from __future__ import annotations

from typing import Iterator

from ..store import keys
from .lines import OUT


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def entries(client, job_id: str, rank: int | None = None, after: str = "-", count: int | None = None
            ) -> list[tuple[str, str, str]]:
    """``(entry id, stream, text)`` of each kept line after ``after`` (an entry id; "-": from the first)."""
    start = after if after == "-" else f"({after}"
    raw = client.xrange(keys.job_output(job_id, rank), min=start, max="+", count=count)
    return [(_text(eid), _text(f.get(b"s", OUT)), _text(f.get(b"t", ""))) for eid, f in raw]


def text(client, job_id: str, rank: int | None = None) -> str:
    """The kept lines as one string, each ending in a newline ("" when the job printed nothing)."""
    return "".join(f"{t}\n" for _, _, t in entries(client, job_id, rank))


def ranks_text(client, job_id: str, world_size: int) -> str:
    """Every rank's kept lines, rank by rank, each line prefixed ``(rank R)``."""
    out = []
    for rank in range(world_size):
        out.extend(f"(rank {rank}) {t}\n" for _, _, t in entries(client, job_id, rank))
    return "".join(out)


def follow(client, job_id: str, ranks: list[int | None], block: float = 1.0,
           done=lambda: False) -> Iterator[tuple[int | None, str, str]]:
    """``(rank, stream, text)`` of each kept line of ``ranks`` (``[None]``: a job's own), the kept ones first,
    then new ones as they come (XREAD BLOCK), until ``done()`` says the job ended and nothing more came
    within ``block`` seconds."""
    last = {keys.job_output(job_id, rank): "0-0" for rank in ranks}
    rank_of = {keys.job_output(job_id, rank): rank for rank in ranks}
    while True:
        got = client.xread(last, block=int(block * 1000), count=1000)
        if not got:
            if done():
                return
            continue
        for key, items in got:
            key = _text(key)
            for eid, f in items:
                last[key] = _text(eid)
                yield rank_of[key], _text(f.get(b"s", OUT)), _text(f.get(b"t", ""))
