// etcd starts a single-member etcd in-process (go.etcd.io/etcd/server/v3/embed)
// for tests/istio.py: the store of the test's kube-apiserver. Loopback only;
// the harness picks the ports and the data directory.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "data directory (required)")
	client := flag.String("listen-client", "", "client URL, e.g. http://127.0.0.1:2379 (required)")
	peer := flag.String("listen-peer", "", "peer URL, e.g. http://127.0.0.1:2380 (required)")
	flag.Parse()
	if *dataDir == "" || *client == "" || *peer == "" {
		log.Fatal("-data-dir, -listen-client and -listen-peer are required")
	}
	cu, err := url.Parse(*client)
	if err != nil {
		log.Fatalf("-listen-client: %v", err)
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		log.Fatalf("-listen-peer: %v", err)
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.Name = "test"
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "warn"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("start: %v", err)
	}
	<-e.Server.ReadyNotify()
	log.Printf("etcd ready on %s", cu.String())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Printf("etcd: %v", err)
	}
	e.Close()
}
