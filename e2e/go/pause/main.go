// Command pause is the sandbox ("pause") container of the nodes cell: it
// holds a Pod's namespaces, reaps the zombies of the Pod's processes when it
// is their init (shared PID namespace), and exits on SIGINT or SIGTERM, as
// Kubernetes' own pause program does. Built static and packed as an OCI
// image by e2e/lib/nodes.sh, so no image is downloaded.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		os.Stdout.WriteString("pause (openflux e2e)\n")
		return
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
