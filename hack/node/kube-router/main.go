// kube-router's network policy controller alone (github.com/cloudnativelabs/kube-router/v2, pkg/controllers/netpol),
// the NetworkPolicy enforcer of the dev cluster's real node: iptables chains KUBE-ROUTER-*, KUBE-POD-FW-*,
// KUBE-NWPLCY-* and ipsets KUBE-SRC-*/KUBE-DST-* for the pods of this node, kept in step with the API server's pods,
// namespaces and NetworkPolicies. It takes kube-router's own flags (--kubeconfig, --hostname-override,
// --service-cluster-ip-range, --iptables-sync-period, ...); routing, the service proxy, BGP and the cloud
// integrations are left out, so the binary links none of them (kube-router's own main links them all).
// The dev node's teardown (hack/posttrain_dev/devnode.py) removes those chains and ipsets.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cloudnativelabs/kube-router/v2/pkg/controllers/netpol"
	"github.com/cloudnativelabs/kube-router/v2/pkg/healthcheck"
	"github.com/cloudnativelabs/kube-router/v2/pkg/options"
	"github.com/spf13/pflag"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kube-router-netpol:", err)
		os.Exit(1)
	}
}

func run() error {
	klog.InitFlags(nil)
	config := options.NewKubeRouterConfig()
	config.AddFlags(pflag.CommandLine)
	pflag.Parse()
	if !config.EnableIPv4 && !config.EnableIPv6 {
		return fmt.Errorf("neither --enable-ipv4 nor --enable-ipv6")
	}
	rest, err := clientcmd.BuildConfigFromFlags(config.Master, config.Kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig %q: %w", config.Kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	factory := informers.NewSharedInformerFactory(client, 0)
	pods := factory.Core().V1().Pods().Informer()
	namespaces := factory.Core().V1().Namespaces().Informer()
	policies := factory.Networking().V1().NetworkPolicies().Informer()
	factory.Start(stop)
	synced := make(chan map[string]bool, 1)
	go func() {
		out := map[string]bool{}
		for t, ok := range factory.WaitForCacheSync(stop) {
			out[t.String()] = ok
		}
		synced <- out
	}()
	select {
	case got := <-synced:
		for name, ok := range got {
			if !ok {
				return fmt.Errorf("informer %s did not sync", name)
			}
		}
	case <-time.After(config.CacheSyncTimeout):
		return fmt.Errorf("informers not synced after %s", config.CacheSyncTimeout)
	}

	ipt, ipsets, err := netpol.NewIPTablesHandlers(config)
	if err != nil {
		return err
	}
	var ipsetMutex sync.Mutex
	npc, err := netpol.NewNetworkPolicyController(client, config, pods, policies, namespaces, &ipsetMutex, ipt, ipsets)
	if err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(npc.PodEventHandler); err != nil {
		return err
	}
	if _, err := namespaces.AddEventHandler(npc.NamespaceEventHandler); err != nil {
		return err
	}
	if _, err := policies.AddEventHandler(npc.NetworkPolicyEventHandler); err != nil {
		return err
	}
	// The controller reports a heartbeat after each sync; nobody else reads them here.
	heartbeats := make(chan *healthcheck.ControllerHeartbeat, 16)
	go func() {
		for range heartbeats {
		}
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go npc.Run(heartbeats, stop, &wg)
	klog.Info("network policy controller running")

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
	close(stop)
	wg.Wait()
	return nil
}
