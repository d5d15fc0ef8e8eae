"""docs/failures.md's table of the core's failures stays true (tests/failure_table.py); each optional part's page has
its own, walked by that part's tests.

The tests named here run the faults themselves and assert the exit status and the `error:` line; this file walks
the table so that a promise added to the page without a test, or a test renamed away, is caught.
"""

from tests.failure_table import named_tests_test, rows_test
from tests.fault_cases import BAD_INPUTS
from tests.helpers import REPO

FAULTS = "tests/test_faults.py"
HOSTILE = "tests/test_hostile_checkpoints.py"
RESTORED = "tests/test_restored_state.py"
VERIFY = "tests/test_verify.py"
# (a fragment of the row's first column, its exit column, the tests that inject that fault). A test is
# "<file>::<function>", or "bad_input:<id>" for a case of tests/fault_cases.py (run by test_faults.py, exit 2).
PAGE = REPO / "docs" / "failures.md"
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
            "tests/test_config.py::test_a_value_of_the_wrong_type_for_the_network_names_the_key_and_the_type_it_takes",
        ],
    ),
    (
        "a key or a config option is misspelt",
        "2",
        [
            "bad_input:key-misspelt",
            "bad_input:nested-key-misspelt",
            "bad_input:deleted-key-misspelt",
            "bad_input:option-misspelt",
            "bad_input:model-option-misspelt",
            "bad_input:evaluate-key-misspelt",
            "bad_input:predict-option-misspelt",
            f"{FAULTS}::test_a_key_the_config_does_not_have_is_one_line_before_anything_runs",
            "tests/test_typos.py::test_the_nearest_keys_are_beside_the_misspelt_one_or_under_the_nearest_parent",
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
        "`data.folds` or `data.fold` cannot be",
        "2",
        [
            "tests/test_folds.py::test_bad_folds_end_in_one_error_line_and_exit_2",
            "tests/test_folds.py::test_a_fold_choice_that_cannot_be_is_refused_as_the_data_is_built",
        ],
    ),
    (
        "`ckpt_path` is not a checkpoint of this project",
        "2",
        [
            "bad_input:resume-from-a-directory",
            "bad_input:resume-another-network",
            "bad_input:evaluate-a-run-dir",
            "bad_input:evaluate-a-checkpoint-without-data",
            "tests/test_workflow.py::test_evaluate_refuses_corrupt_and_foreign_files_in_one_line",
            "tests/test_foreign_checkpoints.py::test_a_foreign_checkpoint_into_another_module_is_one_line_naming_its_keys",
            "tests/test_foreign_checkpoints.py::test_a_foreign_checkpoint_without_model_or_data_names_what_to_give",
            "tests/test_foreign_checkpoints.py::test_train_resumes_a_foreign_checkpoint_and_its_own_checkpoints_then_refuse_model_and_data",
        ],
    ),
    (
        "`init_from` cannot start the run from weights",
        "2",
        [
            "tests/test_init_from.py::test_what_cannot_start_a_run_from_weights_is_one_line",
            "tests/test_init_from.py::test_a_file_of_pickled_objects_is_one_line_and_nothing_of_it_runs",
        ],
    ),
    (
        "a checkpoint's stored config holds anything but plain data",
        "2",
        [
            f"{HOSTILE}::test_a_stored_config_that_holds_anything_but_plain_data_is_refused_naming_where",
            f"{HOSTILE}::test_evaluate_predict_and_train_refuse_a_hostile_stored_config_before_it_runs",
            f"{HOSTILE}::test_a_target_behind_an_interpolation_or_a_resolver_that_acts_is_refused_unresolved",
            f"{HOSTILE}::test_a_trusted_target_is_stopped_from_acting_outside_the_run_even_where_it_catches_the_refusal",
            f"{HOSTILE}::test_a_sharded_checkpoint_that_would_run_code_is_refused_before_dcp_reads_it",
            f"{HOSTILE}::test_opening_a_hostile_file_ends_in_one_line_changing_nothing_outside_the_run_and_connecting_nowhere",
        ],
    ),
    (
        "a resumed checkpoint's callback states name files outside the new run's dir",
        "0",
        [
            f"{RESTORED}::test_every_road_to_a_resume_goes_on_without_touching_what_its_state_names",
            f"{RESTORED}::test_a_resume_drops_each_path_outside_the_run_before_a_callback_takes_it",
            f"{RESTORED}::test_a_requeued_run_resumes_its_own_dir_keeping_its_best",
        ],
    ),
    (
        "a resumed checkpoint's training state is not one this run can take",
        "2",
        [
            f"{RESTORED}::test_a_state_this_runs_objects_cannot_take_is_one_line_before_training",
            f"{RESTORED}::test_a_sharded_index_of_another_shape_is_one_line_before_dcp_reads_it",
            f"{RESTORED}::test_a_sharded_optimizer_state_of_another_shape_is_one_line",
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
            f"{FAULTS}::test_a_ddp_run_that_diverges_stops_on_both_ranks_at_one_step_and_keeps_its_finite_checkpoint",
            f"{FAULTS}::test_a_ddp_spawn_run_that_diverges_ends_in_its_workers_one_line",
            f"{FAULTS}::test_data_that_turns_nan_is_named_as_the_cause_and_a_sweep_counts_the_job_failed",
        ],
    ),
    ("memory runs out", "2", [f"{FAULTS}::test_running_out_of_memory_is_one_line_naming_where"]),
    (
        "a checkpoint from inside an epoch (`trainer.max_steps`, `trainer.max_time`, a mid-epoch one) resumed with a "
        "training loader",
        "2",
        [
            "tests/test_own_modules.py::test_a_resume_inside_an_epoch_is_refused_where_the_data_cannot_say_where_it_stood",
            "tests/test_data_sources.py::test_a_resume_inside_an_epoch_of_batches_the_engine_cannot_order_is_refused",
        ],
    ),
    (
        "a stage has nothing to run on",
        "2",
        [
            "tests/test_data_sources.py::test_a_stage_without_its_step_or_dataloader_is_one_line_naming_what_to_define",
            "tests/test_data_sources.py::test_data_none_builds_no_data_module_and_refuses_a_module_without_batches_of_its_own",
            "tests/test_zoo.py::test_a_chained_cell_works_or_is_refused_in_one_line",
        ],
    ),
    (
        "a resume changes a setting of the optimizer or its schedule",
        "0 or 2",
        [
            "tests/test_resume_settings.py::test_a_hyperparameter_no_schedule_drives_is_the_one_this_run_configures",
            "tests/test_resume_settings.py::test_a_changed_lr_under_a_schedule_or_a_changed_schedule_is_refused_before_a_step",
            "tests/test_resume_settings.py::test_a_resume_with_another_lr_trains_at_it_and_records_it",
        ],
    ),
    (
        "a file a checkpoint's stored config reads has moved",
        "2",
        [
            "tests/test_stored_model_keys.py::test_a_checkpoint_whose_backbone_file_moved_names_the_key_and_opens_with_it",
            "tests/test_stored_model_keys.py::test_a_model_key_given_replaces_the_stored_one_and_a_key_it_lacks_is_refused",
        ],
    ),
    (
        "a callback's `monitor` names a metric the module does not log",
        "2",
        ["tests/test_error_lines.py::test_a_callback_monitoring_a_metric_not_logged_names_those_logged"],
    ),
    (
        "the example classifier (`model=toy`, `mnist_mlp`, `cnn`) on a data module of yours without a `train_set`",
        "2",
        [
            "tests/test_own_modules.py::test_the_example_classifier_refuses_a_data_module_without_a_train_set_before_a_step"
        ],
    ),
    (
        "the module does not log `optimized_metric`",
        "0 or 2",
        [
            "tests/test_own_modules.py::test_a_module_that_logs_no_metric_is_told_which_it_logs_and_trains_on",
            "tests/test_own_modules.py::test_a_grid_sweep_of_a_module_that_logs_no_metric_runs_every_job",
        ],
    ),
    (
        "`project.predict` of a module with no `predict_step`",
        "2",
        [
            "tests/test_own_modules.py::"
            "test_predicting_with_a_module_whose_forward_does_not_take_the_batch_asks_for_a_predict_step",
            "tests/test_predict.py::test_a_type_error_of_the_modules_own_code_keeps_its_traceback",
        ],
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
            f"{FAULTS}::test_sigterm_under_ddp_spawn_ends_its_processes_mid_write_and_names_the_checkpoint_to_resume_from",
            f"{FAULTS}::test_sigterm_after_training_before_the_results_names_the_checkpoint_that_completes_the_run",
        ],
    ),
    (
        "SIGTERM while the run starts",
        "143",
        [
            f"{FAULTS}::test_sigterm_while_python_imports_the_libraries_is_one_line",
            f"{FAULTS}::test_sigterm_while_ddp_ranks_meet_is_one_line_and_leaves_no_process",
            f"{FAULTS}::test_sigterm_after_the_ranks_met_and_before_the_first_epoch_is_one_line",
            f"{FAULTS}::test_sigterm_while_a_sweeps_second_job_starts_says_how_to_carry_the_sweep_on",
        ],
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
        [f"{FAULTS}::test_a_killed_loader_worker_ends_the_run_in_one_line_with_how_to_resume"],
    ),
    (
        "the console goes away",
        "0",
        ["tests/test_train_cli.py::test_a_console_its_reader_closed_leaves_the_run_going_to_its_log_file"],
    ),
    (
        "under DDP, a training step leaves some parameters out of its loss",
        "2",
        [
            "tests/test_unused_parameters.py::test_parameters_a_loss_leaves_out_end_the_run_in_one_line_naming_the_key",
            "tests/test_unused_parameters.py::test_parameters_a_loss_leaves_out_train_with_the_key_the_error_line_names",
            "tests/test_unused_parameters.py::test_ddps_unused_parameter_errors_in_every_wording_are_one_line_naming_the_key",
            "tests/test_unused_parameters.py::test_a_static_graph_under_a_gan_is_refused_in_one_line_saying_to_turn_it_off",
        ],
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
        "`MASTER_PORT` already in use",
        "2",
        [
            "tests/test_waits.py::test_a_master_port_in_use_ends_the_run_in_one_line_naming_it",
            "tests/test_waits.py::test_a_master_port_another_program_holds_ends_a_joining_rank_in_one_line_within_the_timeout",
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
        "multi-node torchrun without `--rdzv-id`",
        "2",
        ["tests/test_switches.py::test_a_multi_node_torchrun_launch_without_an_id_ends_in_one_line"],
    ),
    (
        "one job of a `-m` sweep fails",
        "1",
        [f"{FAULTS}::test_sweep_runs_every_job_when_one_fails_and_exits_1"],
    ),
    (
        "a `-m` sweep carried on finds a job's `results.json` that is not its results",
        "1",
        [
            f"{RESTORED}::test_a_sweep_carried_on_over_results_that_are_not_a_jobs_fails_those_jobs_naming_the_files",
            f"{RESTORED}::test_a_results_json_that_is_not_a_jobs_results_fails_that_job_in_the_table",
        ],
    ),
    (
        "a resumed run had nothing left to train",
        "0",
        [f"{FAULTS}::test_resuming_a_finished_run_reports_its_epochs_and_no_made_up_time"],
    ),
    (
        "`project.verify` is given a dir it cannot verify",
        "2",
        [f"{VERIFY}::test_a_dir_that_cannot_be_verified_ends_in_one_error_line_and_is_left_as_it_was"],
    ),
    (
        "`project.verify` finds a `receipt.json` it cannot read",
        "2",
        [f"{VERIFY}::test_a_dir_that_cannot_be_verified_ends_in_one_error_line_and_is_left_as_it_was"],
    ),
    (
        "`project.verify` of a run dir whose config or overrides name code",
        "2",
        [f"{VERIFY}::test_a_dir_that_cannot_be_verified_ends_in_one_error_line_and_is_left_as_it_was"],
    ),
    (
        "`project.verify` re-runs a run that does not reproduce",
        "1",
        [f"{VERIFY}::test_a_one_line_change_to_the_networks_initialisation_is_named_with_the_first_differing_step"],
    ),
    (
        "a run's untracked or out-of-tree source files exceed the receipt's 10 MB",
        "0",
        ["tests/test_receipts.py::test_copies_stop_at_the_cap_with_one_line"],
    ),
]

test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, BAD_INPUTS)
