"""Ray job payloads, shipped as a job's working_dir (installed as the ``miles_ray.launchers`` package). Each runs
with only ray and the standard library (torch when present), inside the image:

* ``rehearse.py`` -- the placement rehearsal (``submit --rehearse``);
* ``check_data.py`` -- the data and checkpoint preflight on every node (``check-data``, ``doctor``, ``submit``);
* ``comm_check.py`` -- the all-reduce across the GPU workers (``comm-check``);
* ``list_checkpoints.py`` -- a run's checkpoints, listed where they were written (``register``);
* ``miles_commit.py`` -- the commit of the Miles checkout in the image (``submit`` in direct mode, ``doctor``);
* ``supervise.py`` -- not a job: the run supervisor program (``submit --max-restarts``), shipped with
  the run controller's modules (miles_ray/controller) and miles_ray/core's ``supervision.py`` and ``metrics.py``
  beside it (``miles_ray.controller.program``).

The probes print their answer as one ``MILES_RAY_PROBE_RESULT {json}`` line (``miles_ray.core.probes``).
"""
