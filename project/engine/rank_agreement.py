"""Ranks agreeing on a few flags (a SIGTERM seen, a checkpoint due by the clock) without waiting on the device.

A flag one rank sets (its SIGTERM, its clock) must change what every rank does at one same step, or the ranks part
ways and the next collective hangs. An all-reduce of the flags on the training device at every step would agree, but
on GPUs it makes the CPU wait for the device each step, which then idles while the next step is queued. So the flags
travel on a small gloo (CPU) group of their own, asynchronously: the all-reduce a rank starts at one step is read at
its next, and the ranks act one step later than a synchronous agreement would, all at the same step. The Lightning
strategies agree on SIGTERM with it (`project.engine.ddp`); a mid-epoch checkpoint's clock, and a hand-written loop,
can use it too.
"""

from collections.abc import Sequence

import torch
import torch.distributed as dist


class DeferredAgreement:
    """The max over ranks of `size` flags, started by one `exchange` and answered by the next.

    Every rank must call `exchange` and `settle` at the same points (between the same steps), as for any collective.
    Created once every rank has joined the process group, by every rank at once (it creates a process group).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.group = dist.new_group(backend="gloo")  # CPU, whatever the training device
        self._in_flight: tuple[torch.Tensor, dist.Work] | None = None

    def exchange(self, flags: Sequence[bool]) -> list[bool]:
        """The agreement started by the previous call (all False if none is in flight); this call's starts now."""
        agreed = self.settle()
        self.start(flags)
        return agreed

    def start(self, flags: Sequence[bool]) -> None:
        """Start the agreement on `flags`, for the next `settle` or `exchange` to answer; none may be in flight.

        `settle`, act, then `start` is `exchange` with flags computed after the acting: a flag that the acting clears
        (a clock a checkpoint resets) is then not sent once more."""
        if self._in_flight is not None:
            raise RuntimeError("an agreement is in flight already: settle it first")
        sent = torch.tensor([int(flag) for flag in flags], dtype=torch.int32)
        self._in_flight = sent, dist.all_reduce(sent, op=dist.ReduceOp.MAX, group=self.group, async_op=True)

    def settle(self) -> list[bool]:
        """The agreement in flight, waited for (on the other ranks' CPU threads, not on a device); none is left in
        flight. All False if none was."""
        if self._in_flight is None:
            return [False] * self.size
        sent, work = self._in_flight
        self._in_flight = None
        work.wait()
        return [bool(value) for value in sent.tolist()]

    def now(self, flags: Sequence[bool]) -> list[bool]:
        """What any rank has flagged by now, waited for: the agreement in flight, or'ed with `flags` agreed at once."""
        earlier = self.exchange(flags)
        return [a or b for a, b in zip(earlier, self.settle(), strict=True)]
