"""`trainer=dp` keeps the caller's autocast dtype in DataParallel's replica threads (bf16-mixed stays bf16)."""

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from project.optional.dp.strategy import AutocastDataParallel, under_callers_autocast


def in_new_thread(fn: Callable[[], Any]) -> Any:
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=fn()))
    thread.start()
    thread.join()
    return result["value"]


def linear_output_dtype_in_thread_as_parallel_apply_runs_it(replica: Callable[..., Any]) -> torch.dtype:
    """Call `replica` in a fresh thread under autocast with only `enabled`, as `parallel_apply` does: wrong dtype."""

    def worker() -> torch.dtype:
        with torch.autocast("cpu", dtype=torch.float16, enabled=True):
            return replica(torch.ones(4, 3)).dtype

    return in_new_thread(worker)


def test_replica_runs_in_callers_autocast_dtype_in_another_thread():
    linear = nn.Linear(3, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        replica = under_callers_autocast(linear, "cpu")
    assert linear_output_dtype_in_thread_as_parallel_apply_runs_it(linear) == torch.float16  # the bug
    assert linear_output_dtype_in_thread_as_parallel_apply_runs_it(replica) == torch.bfloat16


def test_replica_runs_in_float32_in_another_thread_when_caller_has_autocast_off():
    replica = under_callers_autocast(nn.Linear(3, 2), "cpu")
    assert linear_output_dtype_in_thread_as_parallel_apply_runs_it(replica) == torch.float32


@pytest.mark.gpu
def test_data_parallel_over_two_gpus_keeps_bf16_autocast():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs to run replicas in threads; {torch.cuda.device_count()} visible")
    network = AutocastDataParallel(nn.Linear(3, 2).cuda(0), device_ids=[0, 1])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        plain = nn.DataParallel(network.module, device_ids=[0, 1])(torch.ones(8, 3, device="cuda:0"))
        output = network(torch.ones(8, 3, device="cuda:0"))
    assert plain.dtype == torch.float16  # the bug this class exists for
    assert output.dtype == torch.bfloat16
