"""Every Redis key gpulayer uses, built from one namespace.

Key schema (``gl`` is ``NAMESPACE``):

    gl:workers                 zset   worker id -> last heartbeat (Redis server time, seconds)
    gl:workers:info            hash   worker id -> WorkerInfo JSON
    gl.q.<...>                 list   kombu queues; names built in ``gpulayer/queues.py``
    celery-task-meta-<job id>  string job results, owned by Celery's Redis result backend
    _kombu.binding.<exchange>  set    kombu's exchange bindings, owned by kombu

Lua scripts under ``store/lua/`` receive these names through ``KEYS[]`` only.
"""

from __future__ import annotations

NAMESPACE = "gl"

WORKERS = f"{NAMESPACE}:workers"
WORKERS_INFO = f"{NAMESPACE}:workers:info"
