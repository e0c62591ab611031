// pulumi-fetch fetches a Flux source's artifact the way the Pulumi
// Kubernetes Operator v2.9.0 agent does: fetch.NewArchiveFetcher(3,
// maxUntarSize, maxUntarSize, hostname) and Fetch(url, digest, dir).
//
// Usage: pulumi-fetch URL DIGEST DIR
// Exits non-zero, printing the error, when the fetch fails (an empty or
// wrong digest, an unreachable URL, an archive over the limit).
package main

import (
	"fmt"
	"os"

	"github.com/fluxcd/pkg/http/fetch"
)

// The agent's default untar limit: 100 MiB.
const maxUntarSize = 100 << 20

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: pulumi-fetch URL DIGEST DIR")
		os.Exit(2)
	}
	url, digest, dir := os.Args[1], os.Args[2], os.Args[3]
	if digest == "" {
		fmt.Fprintln(os.Stderr, "pulumi-fetch: empty digest")
		os.Exit(1)
	}
	hostname := os.Getenv("SOURCE_HOST")
	f := fetch.NewArchiveFetcher(3, maxUntarSize, maxUntarSize, hostname)
	if err := f.Fetch(url, digest, dir); err != nil {
		fmt.Fprintln(os.Stderr, "pulumi-fetch:", err)
		os.Exit(1)
	}
}
