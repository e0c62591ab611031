// Command etcd is the upstream etcd server (the same entry point as etcd's own
// main.go), built from the version pinned in e2e/versions.env.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
