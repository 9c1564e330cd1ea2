"""What the worker's next script to Redis carries: its finished jobs' acks and results.

The transport's take (engine/transport.py, ``store/lua/take.lua``) first stores the results the
worker's main process holds (a small success comes back from the job's process unstored,
engine/results.py ``StoreLater``), then acks the jobs the worker finished since its last take. A
result is stored before, or with, its ack, so a worker that dies with acks unsent leaves messages
that come back and are ignored as done; a steady stream of jobs costs the worker one round trip per
take, not three per job.

Results go on the loop turn they come back on, or with the others that come within
``RESULTS_EVERY`` of the last ones sent (``RESULTS_EVERY_BUSY`` while prefetched messages wait on
the worker, whose next take soon carries them); an ack waits up to ``ACK_WAIT`` for a take to ride
on. The channel sends them in a script of their own when no take is due (``Channel._flush_held``).
"""

from __future__ import annotations

from time import monotonic

from kombu.asynchronous import get_event_loop

from .loop import TURN_DELAY

ACK_WAIT = 0.2  # seconds a finished job's ack waits for a take to ride on before it goes alone
RESULTS_EVERY = 0.002  # seconds: results that come within this long of the last ones sent go out together
RESULTS_EVERY_BUSY = 0.010  # the same while the worker holds prefetched messages: a take follows soon


class Carry:
    """The acks and results one channel holds until a script carries them, and those a script in flight carries.

    A script's reply settles what it carried (:meth:`sent`); a script that fails puts them back in front
    (:meth:`unsent`): an ack twice is once, and a result is stored once.
    """

    def __init__(self) -> None:
        self.acks: list[str] = []  # finished (result stored): acked in Redis by the next script
        self.acks_sent: list[str] = []
        self.acks_since = 0.0  # when the oldest waiting ack came
        self.results: list[tuple] = []  # jobs' results to store (results.StoreLater): (key, done key, value, expires)
        self.results_sent: list[tuple] = []
        self.results_at = 0.0  # when a script last carried results
        self.timer_set = False  # a loop timer wakes the worker when waiting results fall due

    def __bool__(self) -> bool:
        """Is anything waiting for a script?"""
        return bool(self.acks or self.results)

    def ack(self, tag: str) -> None:
        if not self.acks:
            self.acks_since = monotonic()
        self.acks.append(tag)

    def acks_overdue(self) -> bool:
        """Have acks waited longer than ``ACK_WAIT`` for a take?"""
        return bool(self.acks) and monotonic() - self.acks_since > ACK_WAIT

    @staticmethod
    def every(busy: bool) -> float:
        """How long results wait for others to go with: longer while prefetched messages wait on the worker
        (``busy``), since the take that follows them carries the results (one script for several jobs)."""
        return RESULTS_EVERY_BUSY if busy else RESULTS_EVERY

    def results_due(self, busy: bool) -> bool:
        """Are results waiting, and is it time to send them without a take?"""
        return bool(self.results) and monotonic() - self.results_at >= self.every(busy)

    def wake_when_due(self, busy: bool) -> bool:
        """Have the event loop wake when the waiting results fall due (its next poll start sends them:
        the transport's ``QoS.can_consume``); False where no event loop runs (send them now)."""
        if self.results_due(busy) or self.timer_set:
            return True
        hub = get_event_loop()
        if hub is None:
            return False
        self.timer_set = True

        def due():
            self.timer_set = False
        hub.call_later(max(self.results_at + self.every(busy) - monotonic(), TURN_DELAY), due)
        return True

    def send(self) -> tuple[list, list, int, list[str]]:
        """Move what waits to the script about to go: take.lua's result keys, result arguments, result count
        and acks."""
        self.acks_sent, self.acks = self.acks, []
        self.results_sent, self.results = self.results, []
        if self.results_sent:
            self.results_at = monotonic()
        result_keys, result_args = [], []
        for key, done, value, expires in self.results_sent:
            result_keys += [key, done]
            result_args += [value, expires]
        return result_keys, result_args, len(self.results_sent), self.acks_sent

    def sent(self) -> None:
        """The script went (done, or handed back after a reconnect: the jobs run again, and store once)."""
        self.acks_sent, self.results_sent = [], []

    def unsent(self) -> None:
        """The script did not go: what it carried goes with the next one, in front."""
        self.acks = self.acks_sent + self.acks
        self.results = self.results_sent + self.results
        self.sent()
