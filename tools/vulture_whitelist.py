"""vulture whitelist (``[tool.vulture]`` in pyproject.toml): ONLY names that a framework reaches without any code
of ours naming them, each with why. vulture matches by name, so ``_.name`` stands for the attribute, method or
function ``name`` wherever it is defined. Never executed.

Not here: a name only tests use (that is a product path for tests: decide whether it goes or the product uses it)
and a name nobody uses (delete it). tests/unit/test_dead_code.py checks that every entry below is still needed
(vulture reports it without this file) and that vulture with this file reports nothing.
"""

# -- Typer / click ----------------------------------------------------------------------------------------------
# The verbs' command functions: cli/app.py VERBS names each by string ("plan" -> ("plan", "plan_cmd", ...)) and
# imports its module with importlib when the verb runs; Typer calls the function.
_.check_data_cmd
_.comm_check_cmd
_.doctor_cmd
_.down_cmd
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
_.kubernetes  # cli/common.py Backend: --backend kubernetes
_.polyaxon_cr  # cli/render.py Format: -F polyaxon-cr

# -- pydantic ---------------------------------------------------------------------------------------------------
_.model_config  # the model's configuration (extra="forbid", frozen ...), read by pydantic's metaclass
# Validators: @field_validator / @model_validator register them; pydantic calls them on validation.
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
_._workers_have_cpus  # core/config.py
_._relative_path  # core/recipes.py
_._consistent  # core/recipes.py
# Fields only pydantic reads: validated from the user's YAML and written out by model_dump.
_.operator  # core/config.py Toleration: dumped into the pods' tolerations (and gpu_capacity's)
_.effect  # core/config.py Toleration: as operator
_.tolerationSeconds  # core/config.py Toleration: as operator
_.max_tokens_per_gpu  # core/recipes.py Recipe: part of content_hash and of the run record's recipe_spec
_.sglang_mem_fraction_static  # core/recipes.py Recipe: as max_tokens_per_gpu
_.optimizer_cpu_offload  # core/recipes.py Recipe: as max_tokens_per_gpu
# RunRecord: written to the run record's JSON by model_dump; what reads it back reads the saved dict by key.
_.schema_  # core/runs.py: "schema" (alias)
_.image_digest  # core/runs.py: read back by key (core/metrics PROVENANCE, services/registry)
_.recipe_spec  # core/runs.py: read back by key (core/metrics)
_.checkpoint_dirs_from  # core/runs.py: provenance of checkpoint_dir/load_dir in the record
_.polyaxon_run_uuid  # core/runs.py: read back by key (services/jobs, services/registry)

# -- Ray's SDK --------------------------------------------------------------------------------------------------
_._raise_error  # adapters/ray_jobs.py: overrides JobSubmissionClient._raise_error, which the SDK calls on non-200

# -- the upstream launcher (tools/capture_upstream_jobs.py) -------------------------------------------------------
# The recorder stands in for Miles' exec_command module and http_utils: the upstream launcher calls these.
_.exec_command_gpu
_.exec_command_multi_node
_.wait_for_server_ready
_.num_nodes  # the argument of Miles' exec_command_multi_node that the stand-in must accept
