"""A job's output: captured where it runs, sent home to the client that sent it, its tail kept with its result.

- ``lines.py``: the pure parts: splitting writes into lines, the per-job rate limit, the tail's bounds, the
  shape of a batch of lines on the wire.
- ``sink.py``: a process's outbox: lines of every job it runs, batched and sent every ``FLUSH`` seconds (one
  pipeline: PUBLISH on each client's channel, XADD to each job's tail), and at once when a job that printed ends.
- ``capture.py``: in a worker's pool process, ``sys.stdout``, ``sys.stderr`` and the root logger around a job.
- ``watch.py``: in a client, one subscriber thread that prints its jobs' lines as ``(fn pid=N on worker) line``.
- ``tail.py``: reading a job's (or a rank's) kept lines: ``handle.logs()``, `gpulayer logs ID [-f]`.
"""
