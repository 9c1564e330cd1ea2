"""Processes: where they start, are watched and stop. Imports only config, models and errors.

- ``env.py``     torchrun's environment for one rank (the direct launcher), torchrun's command line, free
                 ports, the network interface for an advertised address.
- ``runner.py``  the rank runner: start a machine's ranks, stream their output, stop them all on the first
                 failure, and say who failed first (the gang agent and the local ``Trainer(devices=M)``).
- ``warm.py``    warm starts: a template that imported torch once forks each rank, as a fresh process.
- ``stop.py``    the one stopper (``stop``, with its usual forms ``stop_group``, ``stop_process``,
                 ``kill_now`` and ``kill_tree``) and the one parent-death hook (``die_with_parent``).
"""
