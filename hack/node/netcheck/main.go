// netcheck: the one program of the image the real node's NetworkPolicy test runs in its pods
// (tests/e2e/test_network_fences_node.py). Static, no shell, no libc.
//
//	netcheck serve PORT        answers every TCP connection on PORT with "netcheck <hostname>\n"
//	netcheck probe TARGET...   one JSON line per target, then exits 0:
//	                           tcp:HOST:PORT  connect (3 s), read the first line the listener sends
//	                           dns:NAME       resolve NAME with the pod's /etc/resolv.conf (Go's resolver)
//
// A probe line: {"target": ..., "ok": bool, "reply": first line or addresses, "error": why not}.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

const timeout = 3 * time.Second

type result struct {
	Target string `json:"target"`
	OK     bool   `json:"ok"`
	Reply  string `json:"reply,omitempty"`
	Error  string `json:"error,omitempty"`
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: netcheck serve PORT | netcheck probe tcp:HOST:PORT|dns:NAME ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2])
	case "probe":
		out := json.NewEncoder(os.Stdout)
		for _, target := range os.Args[2:] {
			_ = out.Encode(probe(target))
		}
	default:
		fmt.Fprintf(os.Stderr, "netcheck: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

func serve(port string) {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "netcheck:", err)
		os.Exit(1)
	}
	host, _ := os.Hostname()
	fmt.Printf("netcheck serving on %s\n", ln.Addr())
	for {
		conn, err := ln.Accept()
		if err != nil {
			continue
		}
		go func(c net.Conn) {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(timeout))
			fmt.Fprintf(c, "netcheck %s\n", host)
		}(conn)
	}
}

func probe(target string) result {
	r := result{Target: target}
	kind, rest, _ := strings.Cut(target, ":")
	switch kind {
	case "tcp":
		conn, err := net.DialTimeout("tcp", rest, timeout)
		if err != nil {
			r.Error = err.Error()
			return r
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(timeout))
		line, err := bufio.NewReader(conn).ReadString('\n')
		r.OK, r.Reply = true, strings.TrimSpace(line)
		if err != nil && line == "" {
			r.Error = "connected; no line read: " + err.Error()
		}
	case "dns":
		ctx, cancel := context.WithTimeout(context.Background(), 2*timeout)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupHost(ctx, rest)
		if err != nil {
			r.Error = err.Error()
			return r
		}
		r.OK, r.Reply = true, strings.Join(addrs, ",")
	default:
		r.Error = "unknown probe kind " + kind
	}
	return r
}
