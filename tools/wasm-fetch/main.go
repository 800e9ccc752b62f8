// wasm-fetch pulls a wasm module the way Istio's agent and Envoy Gateway do:
// through istio.io/istio/pkg/wasm (LocalFileCache, which uses its
// ImageFetcher for oci:// URLs), and copies the module it returns to -out.
//
// It exists so that the tests can check that the images `make oci` builds are
// accepted by that code, not by a reimplementation of its rules.
//
//	wasm-fetch -cache DIR -out FILE [-insecure HOST:PORT] [-checksum HEX] oci://HOST:PORT/REPO:TAG
//
// On success it prints (after the fetcher's own log lines) one JSON object: {"module": FILE, "sha256": <hex of
// the module>}. On failure it prints the fetcher's error on stderr and exits 1.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"istio.io/istio/pkg/util/sets"
	"istio.io/istio/pkg/wasm"
)

func main() {
	cacheDir := flag.String("cache", "", "directory for the fetcher's module cache (required)")
	out := flag.String("out", "", "where to copy the fetched module (required)")
	insecure := flag.String("insecure", "", "registry host:port to reach over plain HTTP")
	checksum := flag.String("checksum", "", "expected checksum (for oci:// the image manifest digest, hex)")
	timeout := flag.Duration("timeout", 30*time.Second, "request timeout")
	flag.Parse()
	if *cacheDir == "" || *out == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: wasm-fetch -cache DIR -out FILE [-insecure HOST:PORT] [-checksum HEX] URL")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *cacheDir, *out, *insecure, *checksum, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "wasm-fetch:", err)
		os.Exit(1)
	}
}

func run(url, cacheDir, out, insecure, checksum string, timeout time.Duration) error {
	opts := wasm.Options{InsecureRegistries: sets.New[string]()}
	if insecure != "" {
		opts.InsecureRegistries.Insert(insecure)
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return err
	}
	cache := wasm.NewLocalFileCache(cacheDir, opts)
	defer cache.Cleanup()
	path, err := cache.Get(url, wasm.GetOptions{
		Checksum:       checksum,
		ResourceName:   "tenant-ratelimit",
		RequestTimeout: timeout,
		PullPolicy:     wasm.Always,
	})
	if err != nil {
		return err
	}
	module, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, module, 0o644); err != nil {
		return err
	}
	sum := sha256.Sum256(module)
	return json.NewEncoder(os.Stdout).Encode(map[string]string{
		"module": out,
		"sha256": hex.EncodeToString(sum[:]),
	})
}
