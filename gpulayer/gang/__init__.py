"""Distributed jobs (gangs): N workers x M processes, started with torchrun's environment.

Where things are:

- ``handle.py``       ``distributed(...)`` and ``GangHandle``: what the client calls and holds.
- ``coordinator.py``  the coordinator task: place the waiting gangs, in order of arrival, from a snapshot and
                      reserve all their slots at once; end, restart or time out an attempt, in the cluster.
- ``control.py``      the control consumer: every worker serves the coordinator's queue outside its job slots.
- ``outcome.py``      the error a failed attempt raises: the rank that failed first, from its reports.
- ``attempts.py``     each attempt's summary (where it ran, how it ended, the workers lost), for ``fit_info``.
- ``agent.py``        the gang agent in each worker: takes orders, holds the slots, runs the local ranks.
- ``ranks.py``        the rank runner: start a machine's ranks, stream their output, stop them all on the first
                      failure, and say who failed first (the agent and the local ``Trainer(devices=M)`` use it).
- ``warm.py``         warm starts: a template that imported torch once forks each rank, as a fresh process.
- ``launch.py``       torchrun's environment for one rank (the direct launcher), torchrun's command line, the
                      one process stopper (``stop_group``) and parent-death helper (``die_with_parent``).
- ``rank.py``         the entry point of one rank (``python -m gpulayer.gang.rank``).
- ``workdir.py``      a gang's directory on one worker: the shipped working directory its ranks share
                      across restarts, what comes back to the client, and its removal.

Where a rank failure stops all ranks: ``ranks.py`` on its own machine (``RankRunner``: the first failure
stops every local rank), then ``agent.py`` (the failure is published; every other node's agent stops its
ranks on the event). A dead worker's delivered messages go back to their queues in
``gpulayer/worker/janitor.py`` (with the take protocol of ``gpulayer/engine/transport.py``), and its gang
nodes are failed there too (``coordinator.worker_lost``).
"""
