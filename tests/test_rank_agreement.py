"""`DeferredAgreement`: a flag one rank raises reaches every rank at the same later call, over a CPU group."""

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from project.engine.ddp import DeferredAgreement
from tests.helpers import one_rank_process_group, results_of_two_ranks

# Which rank raises which flag at which call: rank 1 a SIGTERM at call 2, rank 0 its clock at call 3.
RAISED = {(1, 2): (True, False), (0, 3): (False, True)}


def agree_on_rank(rank: int, port: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        agreement = DeferredAgreement(size=2)
        answers = [agreement.exchange(RAISED.get((rank, call), (False, False))) for call in range(6)]
        answers.append(agreement.settle())  # call 5's, which nobody flagged
        answers.append(agreement.settle())  # none in flight
        answers.append(agreement.now([rank == 1, False]))  # agreed at once
        results[rank] = answers
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_flag_raised_on_one_rank_reaches_every_rank_at_the_next_call():
    results = results_of_two_ranks(agree_on_rank)
    none, sigterm, clock = [False, False], [True, False], [False, True]
    expected = [none, none, none, sigterm, clock, none, none, none, sigterm]
    assert results[0] == results[1] == expected


def test_starting_an_agreement_while_one_is_in_flight_is_refused_and_keeps_the_first(tmp_path: Path):
    """The first's collective would never be waited for, and the next collective on the group would hang."""
    with one_rank_process_group(tmp_path):
        agreement = DeferredAgreement(size=2)
        agreement.start([True, False])
        with pytest.raises(RuntimeError, match="an agreement is in flight already: settle it first"):
            agreement.start([False, True])
        assert agreement.settle() == [True, False]
        agreement.start([False, True])  # settled: the next may start
        assert agreement.settle() == [False, True]
