// pilot-agent (Istio's sidecar agent), from the pinned istio.io/istio module
// (../go.mod): it starts the test's Envoy as a VM-style mesh workload.
package main

import (
	"os"

	meshconfig "istio.io/api/mesh/v1alpha1"
	"istio.io/istio/pilot/cmd/pilot-agent/app"
	istioagent "istio.io/istio/pkg/istio-agent"
	"istio.io/istio/pkg/log"
	"istio.io/istio/pkg/security"
	"istio.io/istio/security/pkg/nodeagent/sds"
)

func main() {
	log.EnableKlogWithCobra()
	cmd := app.NewRootCommand(func(o *security.Options, c security.SecretManager, p *meshconfig.PrivateKeyProvider) istioagent.SDSService {
		return sds.NewServer(o, c, p)
	})
	if err := cmd.Execute(); err != nil {
		log.Error(err)
		os.Exit(1)
	}
}
