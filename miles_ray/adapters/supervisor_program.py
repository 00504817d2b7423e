"""The run supervisor program as it is shipped to where it runs: ``supervise.py`` (launchers/) with the pure modules
it imports from its own directory, ``supervision.py`` and ``metrics.py`` (miles_ray/core/: the same code the
product folds its events with). Every kind of supervisor (a local process, a Kubernetes Job's ConfigMap, the
Polyaxon run) ships exactly these files (:func:`program_files`) and runs ``python3 supervise.py --spec FILE``."""

from __future__ import annotations

from pathlib import Path

import miles_ray

PROGRAM = "supervise.py"
MODULES = ("supervision.py", "metrics.py")  # from miles_ray/core, imported by supervise.py from its own dir
# shipped too when present beside supervise.py: the reporter supervise.py loads for a spec with a polyaxon section
OPTIONAL = ("polyaxon_reporter.py",)


def _program_path() -> Path:
    """``supervise.py`` of the miles_ray that runs (installed: ``miles_ray/launchers``; a source tree:
    ``<repo>/launchers``)."""
    package = Path(miles_ray.__file__).resolve().parent
    for candidate in (package / "launchers" / PROGRAM, package.parent / "launchers" / PROGRAM):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"the supervisor program {PROGRAM} is not installed beside {package}")


def program_files() -> dict[str, str]:
    """File name -> text of everything the supervisor program needs, to be put in one directory."""
    core = Path(miles_ray.__file__).resolve().parent / "core"
    program = _program_path()
    files = {PROGRAM: program.read_text(encoding="utf-8")}
    for name in OPTIONAL:
        if (program.parent / name).is_file():
            files[name] = (program.parent / name).read_text(encoding="utf-8")
    for name in MODULES:
        files[name] = (core / name).read_text(encoding="utf-8")
    return files


def write_program(directory: Path) -> Path:
    """Put the program's files in ``directory``; the path of ``supervise.py`` there."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in program_files().items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory / PROGRAM
