"""The gang control plane: where a distributed job (N workers x M processes) is placed, started and ended.

- ``coordinator.py``  the coordinator task: place the waiting gangs, in order of arrival, from a snapshot and
                      reserve all their slots at once; end, restart or time out an attempt, in the cluster.
- ``consumer.py``     the control consumer: every worker serves the coordinator's queue outside its job slots.
- ``agent.py``        the gang agent in each worker: takes orders, holds the slots, runs the local ranks
                      (through ``gpulayer/procs/runner.py``).
- ``outcome.py``      the error a failed attempt raises: the rank that failed first, from its reports.
- ``attempts.py``     each attempt's summary (where it ran, how it ended, the workers lost), for ``fit_info``.
- ``rank.py``         the entry point of one rank (``python -m gpulayer.gang.rank``): load the job, run it.
- ``workdir.py``      a gang's directory on one worker: the shipped working directory its ranks share
                      across restarts, what comes back to the client, and its removal.

What the client calls and holds (``distributed(...)``, ``GangHandle``) is ``gpulayer/distributed_job.py``;
starting, watching and stopping the rank processes is ``gpulayer/procs/``. Where a rank failure stops all
ranks: ``procs/runner.py`` on its own machine (the first failure stops every local rank), then
``agent.py`` (the failure is published; every other node's agent stops its ranks on the event). A dead
worker's delivered messages go back to their queues in ``gpulayer/worker/janitor.py``, and its gang
nodes are failed there too (``coordinator.worker_lost``).
"""
