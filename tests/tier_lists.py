"""Which tests leave the fast tier, by test module and test function (tests/tiers.py reads these).

"*" takes the whole module. A parametrized test is listed once, by its function's name.
INTEGRATION: tests that start a process, a server or a connection themselves (a test that
uses the redis_cluster fixture, or a fixture built on it, is integration without a line here).
SLOW: pure tests of seconds each (real simulators, short trainings, ONNX exports), measured
with `python -m pytest -m fast --durations=30`.
"""

from __future__ import annotations

ALL = ("*",)

INTEGRATION: dict[str, tuple[str, ...]] = {
    # real services on loopback: each module's subject
    "test_aggregator_service.py": ALL,
    "test_buffer_client.py": ALL,
    "test_buffer_service.py": ALL,
    "test_buffer_storage.py": ALL,
    "test_local_cluster.py": ALL,
    "test_metrics.py": ALL,
    "test_security.py": ALL,
    "test_soak_hosts.py": ALL,
    "test_sync.py": ALL,
    "test_watchdog.py": ALL,
    # one test of a module of pure ones: a child interpreter, a server, git
    "test_benchmark_harness.py": ("test_the_raw_result_says_what_made_its_figures",),  # git
    "test_benchmark_tables.py": ("test_goal_split_scores_a_real_pickandplace_checkpoint_by_goal_height",),
    "test_cli_errors.py": ("test_deploy_check_of_a_missing_run_dir_in_a_real_process_has_no_traceback",),
    "test_cli_help.py": ("test_help_loads_no_heavy_module",),  # a child interpreter per help page
    "test_cpu.py": (
        "test_a_process_is_not_charged_for_what_ran_before_it_exec_d",
        "test_a_role_total_sums_every_incarnation_and_the_report_splits_overhead",
    ),
    "test_envelope.py": (  # the sweep's worker processes
        "test_a_sweep_writes_every_axis_for_the_float_and_int8_graphs_with_its_nominal_point",
        "test_a_point_scores_what_a_direct_drive_of_the_same_episodes_counts",
    ),
    "test_hardening.py": (
        "test_harden_locks_memory_and_lowers_oom_score_or_says_why_not",
        "test_harden_pins_the_process_to_one_allowed_cpu",
        "test_samplers_the_buffer_and_the_evaluator_do_not_load_torch",
    ),
    "test_fleet_slurm.py": ("test_the_batch_shell_turns_slurms_warning_into_a_clean_stop_of_the_step_and_a_requeue",),
    "test_provenance.py": (
        "test_the_commit_is_heads_and_a_changed_tracked_file_marks_it_dirty",
        "test_this_checkout_is_the_one_whose_commit_a_run_records",
    ),
    "test_role_cleanup.py": (
        "test_an_aggregator_that_cannot_bind_closes_its_tensorboard_writer",
        "test_an_ingest_service_that_cannot_bind_closes_its_redis_client",
        "test_the_aggregator_server_leaves_no_thread_when_it_cannot_bind",
    ),
    "test_sac.py": ("test_compiled_losses_give_the_eager_gradients",),  # torch.compile's worker processes
    "test_sim_registry.py": ("test_import_prints_nothing",),
}

SLOW: dict[str, tuple[str, ...]] = {
    "test_controller.py": ALL,
    "test_agreement.py": (
        "test_a_runs_controllers_int8_included_are_checked_on_the_same_episodes",
        "test_controllers_of_one_policy_on_the_same_reach_episodes_agree_as_the_figures_say",
    ),
    "test_mt10_controllers.py": ALL,
    "test_sim_metaworld.py": ALL,
    "test_aggregator_core.py": (
        "test_grads_per_step_two_steps_on_the_second_push_with_adam_on_the_mean",
        "test_m_learners_of_batch_b_step_as_one_learner_of_batch_m_times_b_on_the_same_data",
    ),
    "test_aggregator_sparse.py": (
        "test_a_restored_lazy_core_continues_as_the_original",
        "test_a_task_routed_run_whose_tasks_keep_their_experts_is_exactly_the_dense_one",
        "test_the_ranges_cover_every_nonzero_gradient_element_and_skip_untouched_experts",
    ),
    "test_deploy_npu.py": (
        "test_cli_out_as_a_folder_writes_the_tasks_file_in_it",
        "test_cli_reports_every_check_and_passes",
        "test_export_for_another_rate_retimes_the_velocity_inputs_in_the_normalizer",
        "test_int8_is_reported_beside_the_float_graph",
    ),
    "test_envelope.py": (  # an export each
        "test_deploy_check_sweep_writes_the_envelope_and_refuses_an_unknown_axis",
        "test_deploy_check_sweeps_a_run_on_another_runs_ranges_and_records_them",
    ),
    "test_evaluator.py": (
        "test_a_checkpoint_is_scored_on_the_same_held_out_episodes_every_time",
        "test_a_full_score_continues_the_curve_episodes_on_the_same_seeds",
        "test_a_hopeless_policy_stops_as_soon_as_the_target_is_out_of_reach",
        "test_a_policy_that_would_reach_the_target_is_never_cut_short",
        "test_early_stop_never_cuts_a_version_that_reaches_the_target_exactly",
        "test_fleetrl_evaluate_first_seed_scores_a_disjoint_held_out_set",
        "test_identical_seeds_give_identical_results_and_other_seeds_other_goals",
        "test_the_sampler_policy_evaluates_deterministically_from_a_weights_snapshot",
    ),
    "test_grasped_start.py": (  # at 120 Hz: sim/rate.py calibrates the hand's scale first
        "test_a_grasped_reset_holds_the_object_between_the_fingers_above_the_table_under_randomization",
    ),
    "test_moe.py": (
        "test_adam_on_the_balancing_loss_keeps_a_lone_tasks_experts_where_switchs_loss_swaps_them",
        "test_fleetrl_export_freezes_a_moe_policys_routing_into_a_graph_the_audit_passes",
        "test_the_moe_actor_exports_with_static_shapes_and_no_data_dependent_ops",
    ),
    "test_multitask_export.py": (
        "test_each_task_exports_on_its_own_input_and_passes_every_check",
        "test_fleetrl_export_writes_every_task_and_one_multi_task_graph_with_manifests",
    ),
    "test_report.py": (
        "test_a_multi_task_moe_run_gets_per_task_curves_and_its_expert_routing",
        "test_main_prints_the_page_path",
        "test_main_writes_into_the_first_run_directory_by_default",
        "test_optional_plots_are_left_out_and_stale_ones_removed",
        "test_report_compares_both_runs_with_valid_pngs",
    ),
    "test_retime.py": ("test_the_velocity_columns_are_the_hands_displacement_per_decision_at_either_rate",),
    "test_sac.py": (
        "test_a_few_hundred_crossq_steps_learn_to_move_toward_the_goal",
        "test_a_few_hundred_sac_steps_reduce_the_critic_loss",
        "test_a_few_hundred_tqc_steps_learn_to_move_toward_the_goal",
        "test_gradients_written_into_reused_buffers_equal_fresh_ones_as_the_task_mix_changes",
    ),
    "test_sampler_demos.py": (
        "test_a_restarted_sampler_stores_only_the_rest_of_its_share",
        "test_a_sampler_stores_its_share_marked_each_episode_the_experts_success",
    ),
    "test_sampler_policy.py": (
        "test_random_action_repeat_holds_each_uniform_action_and_keeps_the_share_of_random_steps",
    ),
    "test_sim_randomization.py": (
        "test_check_env_passes_with_randomization",
        "test_noise_is_on_observation_only_and_rewards_stay_true",
        "test_same_seed_gives_identical_episodes",
    ),
    "test_sim_registry.py": ("test_check_env_passes_nominal", "test_dims_match_the_real_env"),
    "test_why.py": ALL,
}
