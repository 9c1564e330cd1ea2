"""A kombu message as kombu's Redis transport keeps it: the one place gpulayer reads that layout.

A message in a queue is one JSON object (kombu's virtual ``Channel.prepare_message`` builds it, and
``_inplace_augment_message`` adds the properties as it is published)::

    {"body": "<the body, base64 when properties.body_encoding says so>",
     "content-type": "application/x-gpulayer-signed", "content-encoding": "binary",
     "headers": {"id": "<job id>", "task": "<task name>", ...},           # Celery's task headers
     "properties": {"body_encoding": "base64", "delivery_tag": "<tag>",
                    "delivery_info": {"exchange": "", "routing_key": "<queue>"}, "priority": 0}}

and a delivery that is not acknowledged yet is kept in kombu's ``unacked`` hash as the JSON list
``[message, exchange, routing key]`` (kombu's Redis ``QoS.append``). engine/upstream.py pins each of those;
the gang's control consumer, the emulator and the janitor read messages through these functions.
"""

from __future__ import annotations

import base64
import json
from typing import Collection

import orjson
from kombu import serialization
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads


def parse(raw: bytes | str) -> dict:
    """The message ``raw`` (as a queue or a take holds it), decoded from JSON."""
    return json.loads(raw)


def loads_message(item: bytes) -> dict:
    """kombu's JSON ``loads`` of a taken message, without its hook (a Python call per object, ~6 in a message)
    when no object in it can be one of kombu's tagged values (``{"__type__": ..., "__value__": ...}``: a datetime,
    a UUID, bytes, a Decimal), the only objects the hook changes."""
    if b"__type__" in item:
        return loads(bytes_to_str(item))
    try:
        return orjson.loads(item)  # the same values as json.loads, in a third of the time (8 us of a tiny job's)
    except orjson.JSONDecodeError:  # what only Python's json reads (NaN, an integer over 64 bits): as before
        return json.loads(item)


def job_id(message: dict) -> str | None:
    """The Celery task id (gpulayer's job id) the message carries; None when it carries none."""
    return _header(message, "id")


def task_name(message: dict) -> str | None:
    """The name of the Celery task the message calls; None when it names none."""
    return _header(message, "task")


def _header(message: dict, name: str):
    headers = message.get("headers")
    return headers.get(name) if isinstance(headers, dict) else None


def delivery_tag(message: dict) -> str:
    """The tag kombu gave this delivery (the key of its unacked entry and of a worker's delivery record)."""
    return message["properties"]["delivery_tag"]


def decode(message: dict, accept: Collection[str] | None) -> tuple[tuple, dict, dict]:
    """A Celery task message's ``(args, kwargs, embed)``, deserialised by kombu's serializer registry.

    ``accept``: the content types allowed (kombu's ``prepare_accept_content``); any other raises before
    anything is deserialised. ``None``: the content type the message names, whichever it is.
    """
    body = message["body"]
    if (message.get("properties") or {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    content_type = message["content-type"]
    args, kwargs, embed = serialization.loads(body, content_type, message["content-encoding"],
                                              accept={content_type} if accept is None else accept)
    return tuple(args), dict(kwargs), embed


def of_unacked(entry: bytes | str) -> dict:
    """The message of an entry of kombu's ``unacked`` hash (``[message, exchange, routing key]``)."""
    return json.loads(entry)[0]
