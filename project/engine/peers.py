"""How a wait on the other processes of a launch ends, told apart so that it ends in one line naming who did not answer.

torch reports these ends in its own words, and the same words reach several places (Lightning's DDP start-up, the
end of a job, torchrun's agent), so they are recognised here once:
- a port that another program (or another run) already holds, met when a process tries to serve the run's store;
- a store address where another program listens: torch's store client, connected there, waits for an answer
  without end, past its timeout (`answers_as_store` asks first, and gives up in time);
- a collective that timed out: a rank went silent (stopped, hung, far slower than the others) for the whole
  `trainer.strategy.timeout`; `silent_ranks` then asks the run's store which ranks are still there to say so.
"""

import os
import re
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

# The config key that sets how long a rank waits for the others (conf/trainer/ddp.yaml, slurm.yaml, ddp_spawn.yaml).
TIMEOUT_KEY = "trainer.strategy.timeout.seconds"
# How torch says a collective timed out.
TIMEOUT_WORDS = (
    "Timed out waiting",  # gloo, on the rank whose timer ran out
    "Application timeout caused pair closure",  # gloo, on a rank another rank's timeout cut off
    "Watchdog caught collective operation timeout",  # NCCL
)
# How long the ranks that timed out wait for each other to say so: their timers, started as they entered the same
# collective, end within moments of each other.
ROLL_CALL_SECONDS = 3.0


def reserved_port() -> socket.socket:
    """A socket bound to a free port of this machine (`getsockname()[1]`), never listening: while it is open, no other
    bind to port 0 and no outgoing connection here takes that port, and a server that binds it with SO_REUSEADDR
    (torch's TCPStore, Python's HTTP servers) still can. A port only found free, then closed, can be taken by any
    of those before the server that is to listen there binds it."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("", 0))
    return holder


def port_in_use(error: BaseException) -> int | None:
    """The port of torch's "address already in use" (serving a store on a port something else holds), if that is
    what `error` is."""
    if not isinstance(error, dist.DistNetworkError) or "EADDRINUSE" not in str(error):
        return None
    found = re.search(r"port: (\d+)", str(error))
    return int(found.group(1)) if found else None


def answers_as_store(host: str, port: int, seconds: float) -> bool | None:
    """Whether what listens at host:port answers as torch's store (a rendezvous, a process group's) within `seconds`;
    None when nothing listens there yet (torch's client then waits its timeout for the store to start, and says so).

    It is asked from a thread that is given up on: against another program the client waits without end.
    """
    try:
        socket.create_connection((host, port), timeout=seconds).close()
    except OSError:
        return None
    asked, answered = threading.Event(), threading.Event()

    def ask() -> None:
        try:
            dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=seconds)).check(["project/probe"])
            answered.set()
        except RuntimeError:  # it answered, but not as a store does
            pass
        finally:
            asked.set()

    threading.Thread(target=ask, daemon=True, name="store-probe").start()
    return asked.wait(seconds) and answered.is_set()


def collective_timed_out(error: BaseException) -> bool:
    """Whether `error` is a collective that waited the process group's whole timeout for another rank, here or on a
    rank that then closed its connection to this one (gloo's words; NCCL's where its watchdog raises rather than
    aborts)."""
    return (
        isinstance(error, RuntimeError)
        and dist.is_available()
        and dist.is_initialized()
        and any(words in str(error) for words in TIMEOUT_WORDS)
    )


def silent_ranks(seconds: float = ROLL_CALL_SECONDS) -> list[int]:
    """The ranks that do not say, within `seconds`, that they are here: every rank whose collective timed out calls
    this at about the same moment and marks itself in the run's store (MASTER_ADDR:MASTER_PORT, which every rank
    joined); the others are the silent ones.

    A store that does not answer is served by a silent process: rank 0's (Lightning's launcher and torchrun's
    workers serve it there). torch's store client can wait on it past its own timeout, so it is asked from a thread
    that is given up on.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    prefix = f"project/present/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    present: list[int] = []

    def roll_call() -> None:
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        try:
            store = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=seconds))
            store.set(f"{prefix}{rank}", "")
            time.sleep(seconds)
            marked = [other for other in range(world_size) if store.check([f"{prefix}{other}"])]
            present.extend(marked)
        except RuntimeError:  # the store is gone: its process ended
            pass

    caller = threading.Thread(target=roll_call, daemon=True, name="roll-call")
    caller.start()
    caller.join(3 * seconds)
    if not present:  # the store did not answer (or is gone)
        return [0] if rank != 0 else []
    return [other for other in range(world_size) if other not in present]
