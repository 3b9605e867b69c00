"""Developer tooling that ships with the package: the local control plane (devcluster) and the real node
beside it (devnode)."""
