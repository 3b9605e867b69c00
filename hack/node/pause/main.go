// The pod sandbox's process (what Kubernetes' pause image runs): it holds the pod's namespaces, reaps any
// orphaned children, and exits on SIGINT or SIGTERM. Built static (CGO_ENABLED=0) and packed into the dev
// node's sandbox image, since there is no registry to pull registry.k8s.io/pause from.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	child := make(chan os.Signal, 1)
	signal.Notify(child, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			os.Exit(0)
		case <-child:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
