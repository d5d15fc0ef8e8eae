"""How `hydra/launcher=parallel` shares out one machine: GPUs and cores per slot, no two slots sharing either."""

import re

import pytest

from project.engine.errors import UserError
from project.optional.parallel.slots import Slot, check_job_fits, plan_slots, visible_gpus


def test_gpus_are_dealt_out_devices_per_job_at_a_time_and_the_cores_shared_equally():
    slots = plan_slots(["0", "1", "2", "3", "4"], list(range(8)), devices_per_job=2, jobs_at_once=None)
    assert [slot.gpus for slot in slots] == [("0", "1"), ("2", "3")], "the fifth GPU makes no slot of two"
    assert [slot.cores for slot in slots] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [slot.describe() for slot in slots] == ["slot 0 (GPU 0,1, cores 0-3)", "slot 1 (GPU 2,3, cores 4-7)"]


def test_jobs_at_once_caps_the_slots_and_each_then_has_more_cores():
    slots = plan_slots(["a", "b", "c", "d"], list(range(8)), devices_per_job=1, jobs_at_once=2)
    assert [(slot.gpus, slot.cores) for slot in slots] == [(("a",), (0, 1, 2, 3)), (("b",), (4, 5, 6, 7))]


def test_without_gpus_a_device_is_a_core():
    assert [slot.cores for slot in plan_slots([], [0, 1, 2, 3], devices_per_job=1, jobs_at_once=None)] == [
        (0,),
        (1,),
        (2,),
        (3,),
    ]
    two_rank_jobs = plan_slots([], [0, 1, 2, 3, 4], devices_per_job=2, jobs_at_once=None)
    assert [(slot.gpus, slot.cores) for slot in two_rank_jobs] == [((), (0, 1)), ((), (2, 3))]
    assert [slot.cores for slot in plan_slots([], [0, 1, 2, 3], 1, jobs_at_once=3)] == [(0,), (1,), (2,)]


@pytest.mark.parametrize(
    ("gpus", "cores", "per_job", "at_once", "words"),
    [
        (["0"], [0, 1], 2, None, "hydra.launcher.devices_per_job=2 but 1 GPU(s) are there (0): lower it"),
        (["0", "0"], [0, 1], 1, None, "hydra.launcher.devices lists a GPU twice (0,0)"),
        (["0", "1", "2"], [0, 1], 1, None, "3 jobs at once would not each have a CPU core of their own"),
        ([], [0, 1], 0, None, "hydra.launcher.devices_per_job must be a whole number >= 1, got 0"),
        ([], [0, 1, 2], 2, 2, "2 job(s) at once of 2 cores each (hydra.launcher.devices_per_job) need 4 cores"),
        ([], [0], 2, None, "1 job(s) at once of 2 cores each (hydra.launcher.devices_per_job) need 2 cores"),
        ([], [0, 1], 1, 0, "hydra.launcher.jobs_at_once must be a whole number >= 1 or null, got 0"),
    ],
)
def test_a_share_out_that_cannot_work_is_refused_in_one_line(gpus, cores, per_job, at_once, words):
    with pytest.raises(UserError, match="^" + words.replace("(", r"\(").replace(")", r"\)")):
        plan_slots(gpus, cores, per_job, at_once)


@pytest.mark.parametrize(
    ("devices", "fits_one_core", "fits_two_gpus"),
    [(1, True, True), (2, False, True), ("2", False, True), ([0, 1, 2], False, False), ("0,1", False, True)]
    + [("auto", True, True), (-1, True, True), (None, True, True)],
)
def test_a_job_asking_for_more_devices_than_its_slot_has_is_refused(devices, fits_one_core, fits_two_gpus):
    """On a CPU slot a device is a process, which needs a core; on a GPU slot, a GPU. "auto" and -1 take the slot's."""
    cases = ((Slot(0, (), (3,)), fits_one_core), (Slot(1, ("4", "5"), (0,)), fits_two_gpus))
    for slot, fits in cases:
        if fits:
            check_job_fits(slot, devices)
        else:
            with pytest.raises(UserError, match=rf"^trainer.devices={re.escape(str(devices))} asks for \d devices"):
                check_job_fits(slot, devices)


def test_the_visible_gpus_are_cuda_visible_devices_where_it_is_set(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, GPU-5b1e,7")
    assert visible_gpus() == ["3", "GPU-5b1e", "7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_a_launcher_setting_or_task_function_the_workers_cannot_use_is_refused_in_one_line():
    """`checked_settings` runs before any job: devices that are no list, a grace that is no number of seconds, and a
    task function a new Python cannot find by its module and name."""
    from types import SimpleNamespace

    from project.optional.parallel.side_by_side import checked_settings

    def main(cfg):  # defined here: no module has it at its top level
        return None

    def wrapped(cfg):
        return main(cfg)

    wrapped.__wrapped__ = main
    launcher = SimpleNamespace(
        devices=["0"], devices_per_job=1, jobs_at_once=None, stop_grace_s=120, task_function=main
    )
    for changed, words in (
        ({"devices": 0}, "hydra.launcher.devices must be a list of GPUs"),
        ({"stop_grace_s": None}, "hydra.launcher.stop_grace_s must be a number of seconds >= 0, got None"),
        ({}, "hydra/launcher=parallel starts each job in a new Python, which finds the job's function by its module"),
    ):
        with pytest.raises(UserError, match="^" + re.escape(words)):
            checked_settings(SimpleNamespace(**{**vars(launcher), **changed}))
