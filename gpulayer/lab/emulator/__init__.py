"""An emulated fleet: thousands of workers carried by a few processes, on the real registry and queues.

Each emulated worker heartbeats through ``Registry.heartbeat_many`` (batched per
process), takes its queues' messages with the transport's own take script and
delivery records, and completes jobs and gang orders without running user code:

- a job of ``gpulayer.lab.emulator.jobs:emulated(seconds, value)`` sleeps ``seconds``
  and stores ``value`` as its result (a real worker runs the same function for
  real); any other function fails with a message saying emulated workers run no
  user code;
- a gang node of a ``distributed(emulated, seconds, value, fail_rank=...)`` job
  acknowledges its ranks (node 0 publishes a rendezvous address), waits
  ``seconds`` and stores every local rank's ``value``, or reports rank
  ``fail_rank``'s scripted exit, then gives its slots back, as the gang agent does.

>>> with EmulatedFleet(url, secret, workers=10_000, processes=4) as fleet:
...     fleet.wait_registered()
"""

from .fleet import EmulatedFleet, emulated_workers
from .jobs import emulated

__all__ = ["EmulatedFleet", "emulated", "emulated_workers"]
