// The nodes cell's cluster DNS: CoreDNS with only the plugins its Corefile
// (e2e/lib/nodes.sh) names. The upstream main links every plugin CoreDNS
// ships, cloud DNS providers and tracers among them; this one compiles
// about half as many packages.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The Corefile's directives, each registered by its plugin's init.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
