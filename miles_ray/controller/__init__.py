"""The run controller: what carries a run through its failures, wherever its supervisor runs (a process beside
the embedded cluster, a Kubernetes Job, the Polyaxon run of a Miles run), and what the CLI reads of a run's head
by the same rules.

STANDARD LIBRARY ONLY, and nothing of miles_ray: these modules are shipped, one directory flat, beside the
supervisor program (``launchers/supervise.py``) to where nothing of ours is installed, and imported by the product
too (import-linter holds both: pyproject.toml).

- :mod:`.ray_http`: THE client of the Ray head's HTTP APIs (Jobs API, state API, version, activity);
- :mod:`.rules`: the head-loss rule, the GPU-workers-ready rule (with the stale-ALIVE guard) and the attempt
  ledger (attempt ids, the restart budget, the run's latest checkpoint);
- :mod:`.checkpoint_dirs`: the run's ``iter_*`` directories as the supervisor's retention sees and deletes them;
- :mod:`.program`: the supervisor program as every placement ships it (a local process, a Kubernetes Job).
"""
