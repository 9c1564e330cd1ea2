"""Laboratories, not the product: fleets for tests and benchmarks, network-namespace machines, the emulator.

Nothing in the product imports from here (tests/test_import_cycles.py checks it).

- ``fleet.py``     ``Fleet`` (a Redis and real workers on free loopback ports) and ``wait_until`` (``gpulayer/deadline.py``'s).
- ``s3_server.py`` a real S3-compatible server (moto's server mode) on a free loopback port.
- ``netns.py``     "machines" as network namespaces with their own addresses (root and ``ip netns``).
- ``emulator/``    thousands of emulated workers on the real registry and queues.
"""
