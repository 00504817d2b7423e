"""The real_pods tier shares one real-pod cluster (tests/infra/realpods.py): the session fixture below."""

from tests.infra.realpods import real_pods  # noqa: F401 — the tier's session fixture
