//go:build tools

// Pins the containerd 2.x commands hack/build-node.sh builds from this module: the daemon (with its CRI
// plugin, which the kubelet talks to), the runc v2 shim and ctr (image import into the k8s.io namespace).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
