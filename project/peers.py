"""How a wait on the other processes of a launch ends, told apart so that it ends in one line naming who did not answer.

torch reports these ends in its own words, and the same words reach several places (Lightning's DDP start-up,
torchrun's agent), so they are recognised here once:
- a port that another program (or another run) already holds, met when a process tries to serve the run's store.
"""

import re

import torch.distributed as dist


def port_in_use(error: BaseException) -> int | None:
    """The port of torch's "address already in use" (serving a store on a port something else holds), if that is
    what `error` is."""
    if not isinstance(error, dist.DistNetworkError) or "EADDRINUSE" not in str(error):
        return None
    found = re.search(r"port: (\d+)", str(error))
    return int(found.group(1)) if found else None
