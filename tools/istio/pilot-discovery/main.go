// pilot-discovery (istiod), from the pinned istio.io/istio module (../go.mod).
package main

import (
	"os"

	"istio.io/istio/pilot/cmd/pilot-discovery/app"
	"istio.io/istio/pkg/log"
)

func main() {
	log.EnableKlogWithCobra()
	if err := app.NewRootCommand().Execute(); err != nil {
		log.Error(err)
		os.Exit(1)
	}
}
