"""The user's code, shipped to the workers: one mechanism for every way a job starts.

- ``roots.py``     which directory is the user's project (the script's, or the one given)
- ``archive.py``   a deterministic, content-addressed tar of it (and of named modules)
- ``shipping.py``  client side: build once per process, upload once per digest, the header a job carries
- ``cache.py``     worker side: unpack once per digest per machine, put first on ``sys.path`` for the job

``submit``, ``submit_batch``, ``distributed()``, the Trainer's cluster fit and ``gpulayer train`` all ship
through ``shipping.py`` and load through ``cache.py``.
"""
