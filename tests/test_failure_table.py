"""The README's "When things go wrong" table stays true: each row has the tests that inject its fault, and a row
without one, a row whose exit status differs from the one recorded here, or a named test that no longer exists fails.

The tests named here run the faults themselves and assert the exit status and the `error:` line; this file walks
the table so that a promise added to the README without a test, or a test renamed away, is caught.
"""

import ast
import re

import pytest

from tests.fault_cases import BAD_INPUTS
from tests.helpers import REPO

FAULTS = "tests/test_faults.py"
# (a fragment of the row's first column, its exit column, the tests that inject that fault). A test is
# "<file>::<function>", or "bad_input:<id>" for a case of tests/fault_cases.py (run by test_faults.py, exit 2).
ROWS = [
    (
        "a config value, option or key is wrong",
        "2",
        [
            "bad_input:seed-negative",
            "bad_input:lr-not-a-number",
            "bad_input:unknown-precision",
            "bad_input:added-unknown-key",
            "bad_input:mnist-network-on-toy-data",
            "bad_input:search-space-interval-not-a-number",
            "tests/test_config.py::test_a_value_of_the_wrong_type_for_the_network_names_the_key_and_the_type_it_takes",
            f"{FAULTS}::test_a_key_the_config_does_not_have_is_named_by_hydra_before_anything_runs",
        ],
    ),
    (
        "a `${...}` names no key",
        "2",
        ["bad_input:value-refers-to-a-missing-key", "bad_input:config-file-not-valid-yaml"],
    ),
    (
        "a data file is missing or damaged",
        "2",
        [
            "tests/test_bad_data_files.py::test_damaged_file_ends_in_one_error_line_naming_it",
            "tests/test_bad_data_files.py::test_training_on_a_damaged_file_exits_2_with_one_error_line_and_no_checkpoint",
            "bad_input:data-root-missing",
        ],
    ),
    (
        "`ckpt_path` is not a checkpoint of this project",
        "2",
        [
            "bad_input:resume-from-a-directory",
            "bad_input:resume-another-network",
            "bad_input:evaluate-a-run-dir",
            "bad_input:evaluate-the-reference-paths-checkpoint",
            "bad_input:evaluate-a-checkpoint-without-data",
            "tests/test_workflow.py::test_evaluate_refuses_corrupt_and_foreign_files_in_one_line",
        ],
    ),
    (
        "`hydra.run.dir` holds another run",
        "2",
        [
            f"{FAULTS}::test_a_run_dir_given_again_is_refused_unless_the_run_carries_its_run_on",
            f"{FAULTS}::test_a_run_dir_whose_run_failed_at_its_start_can_be_used_again",
        ],
    ),
    (
        "the loss or the gradients turn NaN or infinite",
        "2",
        [
            "bad_input:diverging",
            "bad_input:diverging-reference",
            "bad_input:diverging-compare",
            f"{FAULTS}::test_a_ddp_run_that_diverges_stops_on_both_ranks_at_one_step_and_keeps_its_finite_checkpoint",
            f"{FAULTS}::test_data_that_turns_nan_is_named_as_the_cause_and_a_sweep_counts_the_job_failed",
        ],
    ),
    ("memory runs out", "2", [f"{FAULTS}::test_running_out_of_memory_is_one_line_naming_where"]),
    (
        "a checkpoint from inside an epoch resumed with a data module of your own",
        "2",
        [
            "tests/test_own_modules.py::test_a_resume_inside_an_epoch_is_refused_where_the_data_cannot_say_where_it_stood"
        ],
    ),
    (
        "the module does not log `optimized_metric`",
        "0 or 2",
        ["tests/test_own_modules.py::test_a_module_that_logs_no_metric_is_told_which_it_logs_and_trains_on"],
    ),
    (
        "`project.optional.reference.compare` with a Trainer setting",
        "2",
        [
            "tests/test_compare.py::test_a_trainer_setting_the_reference_does_not_mirror_is_refused_before_training",
            "tests/test_compare_knobs.py::test_every_trainer_setting_agrees_on_both_paths_or_is_refused_in_one_line",
        ],
    ),
    (
        "`project.optional.reference.compare` or a `project.optional.reference` script on a module",
        "2",
        ["tests/test_own_modules.py::test_compare_refuses_a_module_of_your_own_before_training"],
    ),
    (
        "the run dir cannot be made or written in",
        "2",
        [
            f"{FAULTS}::test_run_dir_in_a_read_only_dir_exits_2_naming_it",
            f"{FAULTS}::test_a_run_dir_that_exists_read_only_exits_2_naming_it",
            f"{FAULTS}::test_checkpoints_dir_made_read_only_mid_run_exits_2_and_a_new_run_there_is_refused_before_training",
            f"{FAULTS}::test_disk_full_mid_run_exits_2_and_keeps_the_last_checkpoint",
            f"{FAULTS}::test_disk_full_under_tensorboard_and_the_log_file_is_one_line",
        ],
    ),
    (
        "SIGTERM (`kill`",
        "143",
        [
            f"{FAULTS}::test_sigterm_stops_the_run_with_143_naming_the_checkpoint_to_resume_from",
            f"{FAULTS}::test_sigterm_at_the_first_step_names_what_to_resume_from",
        ],
    ),
    (
        "a mid-epoch checkpoint resumed with another",
        "2",
        ["tests/test_mid_epoch_resume.py::test_a_mid_epoch_checkpoint_resumed_in_another_order_is_refused_in_one_line"],
    ),
    ("Ctrl-C", "130", [f"{FAULTS}::test_ctrl_c_stops_the_run_with_130_naming_the_checkpoint_to_resume_from"]),
    (
        "SIGTERM or Ctrl-C in a `-m` sweep",
        "143 / 130",
        [
            f"{FAULTS}::test_sigterm_ends_a_sweep_without_starting_its_next_job_and_its_hint_carries_the_sweep_on",
            f"{FAULTS}::test_a_ddp_sweep_stopped_in_its_second_job_is_carried_on_by_the_same_command",
        ],
    ),
    (
        "a DataLoader worker dies",
        "1",
        ["tests/test_image_folder.py::test_a_killed_loader_worker_ends_the_run_in_one_line_with_how_to_resume"],
    ),
    (
        "the console goes away",
        "0",
        ["tests/test_train_cli.py::test_a_console_its_reader_closed_leaves_the_run_going_to_its_log_file"],
    ),
    (
        "a DDP rank dies",
        "2",
        [
            f"{FAULTS}::test_rank_1_killed_stops_the_run_naming_it",
            f"{FAULTS}::test_rank_0_killed_takes_its_ranks_along_and_leaves_last_checkpoint_whole",
        ],
    ),
    (
        "`trainer.num_nodes` > 1 without srun or torchrun",
        "2",
        [
            "bad_input:two-nodes-without-a-launcher",
            f"{FAULTS}::test_a_node_that_never_joins_ends_the_run_in_one_line_within_the_timeout",
        ],
    ),
    (
        "`MASTER_PORT` (or torchrun's `--master-port`) already in use",
        "2",
        [
            "tests/test_waits.py::test_a_master_port_in_use_ends_the_run_in_one_line_naming_it",
            "tests/test_waits.py::test_a_master_port_another_program_holds_ends_a_joining_rank_in_one_line_within_the_timeout",
            "tests/test_torchrun.py::test_a_master_port_in_use_ends_the_launch_in_one_line",
        ],
    ),
    (
        "a DDP rank stops answering",
        "1",
        ["tests/test_waits.py::test_a_rank_that_goes_silent_ends_the_run_in_one_line_naming_it_within_the_timeout"],
    ),
    (
        "a DataLoader worker sends no batch",
        "1",
        ["tests/test_waits.py::test_a_stalled_dataloader_worker_ends_the_job_in_one_line_naming_the_data_module"],
    ),
    (
        "multi-node torchrun (`project.optional.torchrun.launcher`",
        "2",
        [
            "tests/test_torchrun.py::test_a_node_that_never_joins_ends_the_launch_in_one_line_within_join_timeout",
            "tests/test_torchrun.py::test_a_rendezvous_endpoint_nobody_serves_ends_the_launch_in_one_line",
            "tests/test_torchrun.py::test_a_rendezvous_endpoint_another_program_holds_ends_the_launch_in_one_line_within_the_timeout",
        ],
    ),
    (
        "multi-node torchrun without `--rdzv-id`",
        "2",
        [
            "tests/test_torchrun.py::test_a_multi_node_launch_without_a_rendezvous_id_is_refused_in_one_line",
            "tests/test_switches.py::test_a_multi_node_torchrun_launch_without_an_id_ends_in_one_line",
        ],
    ),
    (
        "a torchrun worker dies",
        "128+N",
        [
            "tests/test_torchrun.py::test_a_killed_worker_is_restarted_and_the_run_resumes_to_the_uninterrupted_weights",
            "tests/test_torchrun.py::test_a_worker_killed_with_no_restarts_left_ends_the_launch_naming_rank_and_signal",
        ],
    ),
    (
        "one job of a `-m` sweep or Optuna search fails",
        "1",
        [
            f"{FAULTS}::test_sweep_runs_every_job_when_one_fails_and_exits_1",
            "tests/test_search_resume.py::test_a_search_whose_trial_fails_records_it_failed_and_runs_the_others",
        ],
    ),
    (
        "an Optuna search whose `optuna.db`",
        "2",
        ["bad_input:search-with-a-damaged-optuna-db", "bad_input:search-with-an-optuna-2-db"],
    ),
    (
        "a resumed run had nothing left to train",
        "0",
        [f"{FAULTS}::test_resuming_a_finished_run_reports_its_epochs_and_no_made_up_time"],
    ),
]


def readme_rows() -> list[tuple[str, str]]:
    """(what happened, exit) of each row of the README's table (an escaped `\\|` stays in its cell)."""
    section = (REPO / "README.md").read_text().split("## When things go wrong\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| what happened"):
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows.append((cells[0], cells[1]))
    return rows


def defined_tests(path: str) -> set[str]:
    return {node.name for node in ast.walk(ast.parse((REPO / path).read_text())) if isinstance(node, ast.FunctionDef)}


def test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table():
    rows = readme_rows()
    assert len(rows) >= len(ROWS) > 20
    for what, exit_status in rows:
        listed = [(fragment, status) for fragment, status, _ in ROWS if what.startswith(fragment)]
        assert len(listed) == 1, f"README row without its one entry in ROWS: {what}"
        assert listed[0][1] == exit_status, f"the README says exit {exit_status} for: {what}"
    for fragment, _, _ in ROWS:
        assert any(what.startswith(fragment) for what, _ in rows), f"no README row starts {fragment!r} any more"


@pytest.mark.parametrize(("fragment", "exit_status", "tests"), ROWS, ids=[row[0] for row in ROWS])
def test_the_tests_a_row_names_exist(fragment: str, exit_status: str, tests: list[str]):
    bad_inputs = {case.id for case in BAD_INPUTS}
    for test in tests:
        if test.startswith("bad_input:"):
            assert test.removeprefix("bad_input:") in bad_inputs, test
            assert exit_status.startswith("2"), f"fault_cases.py's cases end with exit 2, not {exit_status}"
        else:
            path, name = test.split("::")
            assert name in defined_tests(path), f"{test} is not a test any more"
