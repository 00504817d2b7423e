"""vulture whitelist (``[tool.vulture]`` in pyproject.toml): ONLY names that a framework reaches without any code
of ours naming them, each with why. vulture matches by name, so ``_.name`` stands for the attribute, method or
function ``name`` wherever it is defined. Never executed.

Not here: a name only tests use (that is a product path for tests: decide whether it goes or the product uses it)
and a name nobody uses (delete it). tests/unit/test_dead_code.py checks that every entry below is still needed
(vulture reports it without this file) and that vulture with this file reports nothing.
"""

# -- the run supervisor's reporter (launchers/polyaxon_report.py) ------------------------------------------------
# launchers/supervise.py calls the reporter's hooks by name (getattr(reporter, "attempt_started") ...).
_.attempt_started
_.attempt_ended
_.checkpoint_deleted
_.log_chunk
# traceml's tracking Run calls its event logger's add_events (Run.log_metrics -> Run._add_events): the reporter's
# synchronous writer (_Synchronous) stands in that place.
_.add_events

# -- methods a framework calls on their own class ---------------------------------------------------------------
# tests/unit/test_dead_code.py also reads methods by their class (a method is not used because another class reads
# an attribute of its name); the ones only a framework calls, as "Class.method": why. A dict, so vulture reads no name
# from it. (None today: cli/common.py's _Page.size, which Rich's Console reads and sets, is found used by name since
# the reporter reads the retention's ``CKPT.size``.)
{
}
# io.RawIOBase's methods on adapters/kube/pull_pod.py ExecStream (io's own read/BufferedReader call them)
_.readable
_.readinto

# -- Typer / click ----------------------------------------------------------------------------------------------
# The verbs' command functions: cli/app.py VERBS names each by string ("plan" -> ("plan", "plan_cmd", ...)) and
# imports its module with importlib when the verb runs; Typer calls the function.
_.check_data_cmd
_.clusters_cmd
_.comm_check_cmd
_.doctor_cmd
_.down_cmd
_.env_cmd
_.init_cmd
_.logs_cmd
_.park_cmd
_.plan_cmd
_.recipes_cmd
_.register_cmd
_.render_cmd
_.resume_cmd
_.scale_cmd
_.status_cmd
_.stop_cmd
_.submit_cmd
_.up_cmd
_.compare_cmd  # cli/compare.py: cli/app.py's GROUPS names it by string as `runs compare`; Typer calls it
_.plot_cmd  # cli/plot.py: cli/app.py's GROUPS names it by string as `runs plot`; Typer calls it
_.outputs_cmd  # cli/outputs.py: cli/app.py's GROUPS names it by string as `runs outputs`; Typer calls it
_.pull_cmd  # cli/pull.py: cli/app.py's GROUPS names it by string as `runs pull`; Typer calls it
_.runs_cmd  # cli/runs.py: @runs_app.callback(), Typer calls it before `runs compare` or alone
_._root  # cli/app.py: @app.callback(), the global options (--version, --debug); Typer calls it
# cli/app.py: the lazy click Group; click reads Group.commands and calls list_commands() for the help listing.
_.commands
_.list_commands
# cli/options.py: the option-group decorator gives the wrapper the signature Typer reads (inspect.signature and
# typing.get_type_hints read __signature__ and __annotations__).
_.__signature__
_.__annotations__

# -- Enum members that Typer parses from the command line by value (no code names them) --------------------------
_.colocated  # cli/common.py Layout: --layout colocated
_.disaggregated  # cli/common.py Layout: --layout disaggregated
_.none  # cli/common.py RayAuth: --ray-auth none

# -- pydantic ---------------------------------------------------------------------------------------------------
_.model_config  # the model's configuration (extra="forbid", frozen ...), read by pydantic's metaclass
# Validators: @field_validator / @model_validator register them; pydantic calls them on validation.
_._a_catalogued_rule  # core/planner.py Violation.rule
_._name  # core/config.py
_._ns  # core/config.py
_._dns  # core/config.py
_._quantity  # core/config.py
_._cpu_quantity  # core/config.py
_._abs  # core/config.py
_._rel  # core/config.py
_._address  # core/config.py
_._ray_version  # core/config.py
_._ray_auth_secret  # core/config.py
_._env  # core/config.py
_._secret_env  # core/config.py
_._env_disjoint  # core/config.py
_._gcs_ft  # core/config.py
_._gcs_ft_password_secret  # core/config.py
_._gcs_ft_complete  # core/config.py
_._workers_have_cpus  # core/config.py
_._gpu_memory  # core/config.py
_._relative_path  # core/recipes.py
_._consistent  # core/recipes.py
# Fields only pydantic reads: validated from the user's YAML and written out by model_dump.
_.operator  # core/config.py Toleration: dumped into the pods' tolerations (and gpu_capacity's)
_.effect  # core/config.py Toleration: as operator
_.tolerationSeconds  # core/config.py Toleration: as operator
# core/memory/estimate.py MemoryEstimate parts: the -o json "memory" keys scripts compare (issue 36 names them),
# written by model_dump; the table reads the FitLine rows instead.
_.parameters_per_gpu
_.bytes_per_parameter
_.distributed_optimizer
_.optimizer_offload
_.weights_and_optimizer_bytes
_.activations_bytes
_.weights_bytes_per_gpu
_.kv_cache_bytes_per_gpu
_.bytes_per_node
_.checkpoint_bytes
_.checkpoints_kept
_.bytes_needed
_.capacity_bytes
# RunRecord: written to the run record's JSON by model_dump; what reads it back reads the saved dict by key.
_.memory_check  # core/records/run.py: set by submit --no-memory-check (the estimate was not enforced)
_.schema_  # core/records/run.py: "schema" (alias)

# -- Ray's SDK --------------------------------------------------------------------------------------------------
_._raise_error  # adapters/ray_jobs.py: overrides JobSubmissionClient._raise_error, which the SDK calls on non-200

# -- the upstream launcher (tools/capture_upstream_jobs.py) -------------------------------------------------------
# The recorder stands in for Miles' exec_command module and http_utils: the upstream launcher calls these.
_.exec_command_gpu
_.exec_command_multi_node
_.wait_for_server_ready
_.num_nodes  # the argument of Miles' exec_command_multi_node that the stand-in must accept
_.made_by  # miles_ray/core/upstream_jobs.py: a field of the capture pydantic validates (the command that made it)
_.pod_uid  # core/records/run.py Head: a field of the record's head, read and written as the record's JSON

# -- Rich ----------------------------------------------------------------------------------------------------
_.overflow  # cli/compare.py folded(): Rich reads Column.overflow when it renders the table

# -- pydantic hooks ---------------------------------------------------------------------------------------------
_.model_post_init  # services/backends/results.py Ordered: pydantic calls it after validation
_._recipes  # services/recipes.py RecipeCatalog: a @field_serializer, pydantic calls it when dumping
_._as_given  # core/records/run.py Part: a @model_serializer, pydantic calls it when dumping a record's part

# -- fields of the typed results (core/results.py Result) that no code of ours reads by name: to_json() (pydantic's
# model_dump) writes every one into the -o json/-o yaml output users parse. The block is exactly the Result
# fields vulture would report; tests/unit/test_dead_code.py checks it and prints the block to paste when it differs.
# BEGIN result fields
_.adjusted
_.alive_count
_.bundle
_.busy_jobs
_.bytes_sent
_.dead_count
_.dead_nodes
_.differences
_.driver_exit_code
_.end_time
_.existing_run
_.force_killed
_.from_
_.generation
_.gpu_ids
_.grace_cut
_.head_pid
_.head_service
_.job_status
_.last_job_end
_.launcher_job
_.metric_lines
_.mount_device
_.mountpoint
_.observed_generation
_.operation_of
_.pods_remaining
_.polyaxon_deleted
_.polyaxon_stopped
_.ray_error
_.ray_job_id
_.ray_node_ips
_.reference
_.requested_nodes
_.resume_output_dir
_.root_exists
_.scale_seconds
_.seconds_start
_.seconds_total
_.seen_at
_.skipped_bytes
_.stopped_nodes
_.stopped_uuid
_.temp_dir
_.total_cpus
_.up_seconds
_.verified
_.was_parked
_.worker_pids
_.writable_dir
# END result fields
