// CoreDNS built from the Go module proxy: the same main as CoreDNS's own coredns.go, with its default plugin
// set (kubernetes, forward, cache, ... registered by core/plugin).
package main

import (
	_ "github.com/coredns/coredns/core/plugin"
	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
