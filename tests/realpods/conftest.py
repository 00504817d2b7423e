"""The real_pods tier shares one real-pod cluster (tests/infra/realpods.py): the session fixture below.
Its figures (REAL_PODS_FIGURES, written by test_zz_teardown.py) end the run's summary."""

from tests.infra.realpods import SUMMARY, real_pods  # noqa: F401 — the tier's session fixture


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 — pytest's own reporter type
    for line in SUMMARY:
        terminalreporter.write_line(line)
