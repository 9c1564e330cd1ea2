"""Who may stop a job: its owner, an admin, or the cluster secret's holder; with no users, anyone (as before).

A cancel reaches workers two ways (gpulayer/cancel.py): Celery's revoke broadcast, a message through the
signed serializer (its signer is :func:`signing.last_signer`), and the ids published on the cancel channel,
signed here (:func:`pack`, :func:`unpack`). Workers decide with :func:`refusal`, the job's owner being the
sender its message names (checked against the signature on receipt).
"""

from __future__ import annotations

from .. import signing

PLAIN = "<unsigned>"  # a cancel-channel message without a signature (a client from before users, or anyone)


def pack(ids: list[str]) -> bytes:
    """The cancel channel's message for ``ids``: signed by this process (its token, or the cluster secret)."""
    return signing.sign("\n".join(ids).encode())


def unpack(data: bytes) -> tuple[list[str], str | None]:
    """``(ids, signer)`` of a cancel-channel message: signer None for the cluster, :data:`PLAIN` unsigned;
    ``PayloadRejected`` for a bad signature."""
    if data[:2] == b"GL" and data[2:3].isdigit():
        text = signing.verify(data)
        return text.decode().split("\n"), signing.last_signer()
    return data.decode().split("\n"), PLAIN


def refusal(signer: str | None, owner: str | None, job_id: str) -> str | None:
    """Why ``signer`` may not cancel ``owner``'s job ``job_id``, or None when it may."""
    if signer is None or not signing.users_defined():
        return None
    if signer == PLAIN:
        return (f"an unsigned cancel of job {job_id} was ignored: this cluster has users, and a cancel must be "
                "signed by the job's owner or an admin")
    entry = signing.users().get(signer)
    if entry is not None and entry.admin and not entry.revoked:
        return None
    if owner == signer:
        return None
    return (f"user {signer!r} may not cancel job {job_id}: it was sent by {owner or 'someone else'!r}; only its "
            "owner or an admin may cancel it")

