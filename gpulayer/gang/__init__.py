"""Distributed jobs (gangs): N workers x M processes, started with torchrun's environment.

Where things are:

- ``handle.py``       ``distributed(...)`` and ``GangHandle``: what the client calls and holds.
- ``coordinator.py``  the coordinator task: place a gang from a snapshot and reserve all its slots at once.
- ``agent.py``        the gang agent in each worker: takes orders, holds the slots, runs the local ranks.
- ``ranks.py``        the rank runner: start a machine's ranks, stream their output, stop them all on the first
                      failure, and say who failed first (the agent and the local ``Trainer(devices=M)`` use it).
- ``warm.py``         warm starts: a template that imported torch once forks each rank, as a fresh process.
- ``launch.py``       torchrun's environment for one rank (the direct launcher), torchrun's command line, the
                      one process stopper (``stop_group``) and parent-death helper (``die_with_parent``).
- ``rank.py``         the entry point of one rank (``python -m gpulayer.gang.rank``).

A dead worker's delivered messages go back to their queues in ``gpulayer/worker/janitor.py``.
"""
