"""e2e tests reuse the real control plane fixtures of tests/integration (one definition, imported)."""

from integration.conftest import ClusterHandle, cluster, namespace  # noqa: F401
