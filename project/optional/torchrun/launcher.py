"""torchrun, ending in one line when the launch fails:

    python -m project.optional.torchrun.launcher [torchrun options] -m <module> ...


It is torch's own launcher (`torch.distributed.run`: the same options, the same `PET_*` variables), started the
same way on every node. What it adds is how a failed launch ends. torchrun ends each of these with a traceback of
its own code, the first after 10 minutes of silence: a rendezvous that not every node joins (a node not started,
another `--rdzv-id`), a rendezvous endpoint it cannot reach, a worker that failed after its restarts, a
`--master-port` that another program holds; and a rendezvous endpoint that another program holds (a web server)
it waits on past `read_timeout`, for ten minutes and more. Here each is one `error:` line naming the fix, with the
failed worker's exit status (2 for a user's error, 128 + N for signal N), within the waits of `--rdzv-conf`:
`read_timeout` for the endpoint to answer, `join_timeout` for the nodes (by default the 300 s of
`trainer.strategy.timeout`). scripts/torchrun/train.sh runs it with a whole multi-node launch's options.

It also makes elastic restarts work (`--max-restarts`): by default torchrun's rendezvous hands the workers of
every attempt one store that lives as long as the first node's agent, and the workers' process group keys in it
are not told apart by attempt; restarted workers then read the addresses of the dead ones and fail to connect
(or wait until the timeout). With `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, set here unless the user set it, each
attempt's rank 0 serves a store of its own, as torchrun did before it shared one (pytorch/pytorch#135712, still so
in torch 2.14: the agent creates the shared store once, at its first rendezvous).
"""

import os
import signal
import sys

from torch.distributed import DistNetworkError
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
from torch.distributed.run import parse_args, run

from project.engine.ddp import answers_as_store, port_in_use

# The port of a c10d rendezvous endpoint that names none (torch's own default).
DEFAULT_RENDEZVOUS_PORT = 29400
# Seconds the first node waits for the others: trainer.strategy.timeout's default, not torchrun's 600.
JOIN_TIMEOUT = 300
# The exit status when the launcher itself fails (not a worker): a user's error, as everywhere in the project.
LAUNCH_FAILED = 2


def with_join_timeout(rdzv_conf: str) -> str:
    """`--rdzv-conf` with this module's `join_timeout` added, unless the user set one."""
    if "join_timeout=" in rdzv_conf:
        return rdzv_conf
    return ",".join(part for part in (rdzv_conf, f"join_timeout={JOIN_TIMEOUT}") if part)


def conf_value(rdzv_conf: str, key: str, default: str) -> str:
    """One `key=value` of `--rdzv-conf`."""
    pairs = dict(part.split("=", 1) for part in rdzv_conf.split(",") if "=" in part)
    return pairs.get(key, default)


class NotARendezvous(RendezvousConnectionError):
    """Something listens at the rendezvous endpoint, but it is no rendezvous: it never answers a store's request."""


def check_endpoint_answers(args) -> None:
    """Raise `NotARendezvous` if the c10d rendezvous endpoint is held by something that does not answer as one (torch
    would wait on it past `read_timeout`, for ten minutes and more). An endpoint nobody listens on yet is left to
    torch, which waits `read_timeout` for the first node to serve it."""
    if args.rdzv_backend != "c10d":
        return
    host, port = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=DEFAULT_RENDEZVOUS_PORT)
    if answers_as_store(host, port, float(conf_value(args.rdzv_conf, "read_timeout", "60"))) is False:
        raise NotARendezvous(f"{host}:{port} does not answer as a rendezvous store")


def rendezvous_line(args, error: RendezvousError) -> str:
    """The one line for a rendezvous that failed: where it was, and what the user can change."""
    where = f"the rendezvous at {args.rdzv_endpoint} (--rdzv-id={args.rdzv_id})"
    if isinstance(error, RendezvousTimeoutError):
        seconds = conf_value(args.rdzv_conf, "join_timeout", "600")
        return (
            f"{where} did not gather --nnodes={args.nnodes} node(s) within {seconds} s: start the same command on "
            "every node, with the same --rdzv-endpoint and --rdzv-id (join_timeout in --rdzv-conf sets the wait)"
        )
    if isinstance(error, NotARendezvous):
        seconds = conf_value(args.rdzv_conf, "read_timeout", "60")
        return (
            f"nothing at {args.rdzv_endpoint} answers as a rendezvous within {seconds} s (another program holds that "
            "port): --rdzv-endpoint must be host:port of the first node, on a port no other program uses "
            "(read_timeout in --rdzv-conf sets the wait)"
        )
    if isinstance(error, RendezvousConnectionError):
        seconds = conf_value(args.rdzv_conf, "read_timeout", "60")
        return (
            f"cannot reach {where} within {seconds} s: --rdzv-endpoint must be host:port of the first node, "
            "reachable from every node, and that node up (read_timeout in --rdzv-conf sets the wait)"
        )
    return f"{where} failed: {' '.join(str(error).split()) or type(error).__name__}"


def likely_cause(failure) -> int:
    """How likely a failed worker is what failed the launch, where several failed in one second (torch times them by
    the whole second), most likely first: killed by a signal from outside (the kernel's out-of-memory killer, a user),
    then ended by an error of its own, then stopped by torchrun itself (SIGTERM) once another had failed."""
    if failure.exitcode < 0:
        return 2 if -failure.exitcode == signal.SIGTERM else 0
    return 1


def worker_line(args, error: ChildFailedError) -> tuple[str, int]:
    """The one line for a worker that failed (after any restarts), and the exit status to end with."""
    rank, failure = min(error.failures.items(), key=lambda item: (item[1].timestamp, likely_cause(item[1]), item[0]))
    restarts = f" after {args.max_restarts} restart(s)" if args.max_restarts else ""
    if failure.exitcode < 0:  # killed by a signal
        what, status = f"was killed by {failure.signal_name()}", 128 - failure.exitcode
    else:
        what, status = f"exited with status {failure.exitcode}", failure.exitcode
    why = "; its own output above says why" if failure.exitcode > 0 else " (out of memory, or killed from outside)"
    return f"{error.name}: rank {rank} {what}{restarts}{why}", status


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.rdzv_conf = with_join_timeout(args.rdzv_conf)
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    try:
        check_endpoint_answers(args)
        run(args)
    except RendezvousError as error:
        print(f"error: {rendezvous_line(args, error)}", file=sys.stderr, flush=True)
        sys.exit(LAUNCH_FAILED)
    except DistNetworkError as error:  # the agent serves its own store (--master-port) on a port it cannot have
        port = port_in_use(error)
        if port is None:
            raise
        print(f"error: --master-port={port} is in use on this machine: pick another port", file=sys.stderr, flush=True)
        sys.exit(LAUNCH_FAILED)
    except ChildFailedError as error:
        line, status = worker_line(args, error)
        print(f"error: {line}", file=sys.stderr, flush=True)
        sys.exit(status)
    except SignalException as error:  # torchrun has passed the signal on to the workers, which report it
        sys.exit(128 + signal.Signals(error.sigval).value)


if __name__ == "__main__":
    main()
