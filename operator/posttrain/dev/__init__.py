"""Developer tooling that ships with the package: the local control plane (devcluster)."""
