"""Developer tooling, never in a package or an image: the local control plane (devcluster), the real node
beside it (devnode) and Kueue's manager for it (kueue). It lives under hack/ with the scripts that build
its binaries; `make cluster-up`, hack/*.py and the tests (pyproject: pytest's pythonpath) put hack/ on the
import path."""
