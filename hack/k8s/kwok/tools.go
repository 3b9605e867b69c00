//go:build tools

// Pins kwok (the simulated-node controller) for `go build sigs.k8s.io/kwok/cmd/kwok`.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
