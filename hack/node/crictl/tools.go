//go:build tools

// Pins crictl, the CRI client hack/build-node.sh builds: the dev node's teardown stops and removes every pod
// sandbox through the CRI (which runs the CNI DEL that frees each pod's IP, veth and port mappings).
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
