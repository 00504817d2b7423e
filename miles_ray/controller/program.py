"""The run supervisor program as it is shipped to where it runs: ``supervise.py`` (launchers/) with the modules it
imports from its own directory: the run controller's (miles_ray/controller/: the Ray client and the rules, the same
code the CLI uses) and ``supervision.py`` and ``metrics.py`` (miles_ray/core/: the same code the product folds its
events with), one directory flat. Every kind of supervisor (a local process, a Kubernetes Job's ConfigMap, the
Polyaxon run) ships exactly these files (:func:`program_files`) and runs ``python3 supervise.py --spec FILE``."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # miles_ray/

PROGRAM = "supervise.py"
# imported by supervise.py from its own dir: miles_ray/<package>/<file>
MODULES = (("controller", "ray_http.py"), ("controller", "rules.py"), ("controller", "checkpoint_dirs.py"),
           ("core", "supervision.py"), ("core", "metrics.py"))
# shipped too when present beside supervise.py: the reporter supervise.py loads for a spec with a polyaxon section
OPTIONAL = ("polyaxon_report.py", "polyaxon_journal.py")


def _program_path() -> Path:
    """``supervise.py`` of the miles_ray that runs (installed: ``miles_ray/launchers``; a source tree:
    ``<repo>/launchers``)."""
    for candidate in (PACKAGE / "launchers" / PROGRAM, PACKAGE.parent / "launchers" / PROGRAM):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"the supervisor program {PROGRAM} is not installed beside {PACKAGE}")


def program_files() -> dict[str, str]:
    """File name -> text of everything the supervisor program needs, to be put in one directory."""
    program = _program_path()
    files = {PROGRAM: program.read_text(encoding="utf-8")}
    for name in OPTIONAL:
        if (program.parent / name).is_file():
            files[name] = (program.parent / name).read_text(encoding="utf-8")
    for where, name in MODULES:
        files[name] = (PACKAGE / where / name).read_text(encoding="utf-8")
    return files


def write_program(directory: Path) -> Path:
    """Put the program's files in ``directory``; the path of ``supervise.py`` there."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in program_files().items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory / PROGRAM
