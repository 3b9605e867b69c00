//go:build tools

// Pins the Argo CD multi-call binary hack/build-argocd.sh builds from this module.
package tools

import (
	_ "github.com/argoproj/argo-cd/v3/cmd"
)
