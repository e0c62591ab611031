// Command spiffe-fetch downloads an artifact the way kustomize-controller
// v1.10 does when it runs with --authorized-artifact-server-spiffe-id: it
// takes its own X.509-SVID and the trust bundles from the SPIFFE Workload
// API (SPIFFE_ENDPOINT_SOCKET, as go-spiffe reads it), presents the SVID as
// its client certificate, verifies the server's chain against the bundle of
// the server's trust domain and accepts the server only if its SPIFFE ID
// matches one of the authorized IDs, in Flux's syntax:
//
//	spiffe://<trust domain>          any ID of that trust domain
//	spiffe://<trust domain>/<path>   exactly that ID
//	spiffe://<trust domain>/<path>/  every ID under that path
//	spiffe://self[/<path>[/]]        the same, in the client's own trust domain
//
// It stands in for kustomize-controller v1.10, whose module cannot be built
// here (see e2e/versions.env); it is built on go-spiffe v2, the library
// kustomize-controller v1.10 builds on, with tlsconfig.MTLSClientConfig.
//
// On success it writes the body to --output and prints one JSON line (HTTP
// status, the server's SPIFFE ID and certificate serial, size and sha256 of
// the body). Any failure
// (no SVID, a refused server, a refused client, a non-200 answer) exits 1
// with the reason on stderr.
//
// Usage: spiffe-fetch --authorized-artifact-server-spiffe-id=ID... [--output=FILE] [--timeout=30s] URL
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "spiffe-fetch:", err)
		os.Exit(1)
	}
}

func run() error {
	var servers repeated
	flag.Var(&servers, "authorized-artifact-server-spiffe-id",
		"SPIFFE ID of an artifact server authorized to serve artifacts. Can be repeated.")
	output := flag.String("output", "", "file the artifact is written to")
	timeout := flag.Duration("timeout", 30*time.Second, "bound of the whole fetch, SVID included")
	flag.Parse()
	if flag.NArg() != 1 {
		return errors.New("exactly one URL is required")
	}
	if len(servers) == 0 {
		return errors.New("at least one --authorized-artifact-server-spiffe-id is required")
	}
	target, err := url.Parse(flag.Arg(0))
	if err != nil || target.Scheme != "https" {
		return fmt.Errorf("artifact URL %q: an artifact served over SPIFFE mTLS has an https URL", flag.Arg(0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	source, err := workloadapi.NewX509Source(ctx)
	if err != nil {
		return fmt.Errorf("unable to create SPIFFE X.509 source: %w", err)
	}
	defer source.Close()
	own, err := source.GetX509SVID()
	if err != nil {
		return fmt.Errorf("no X.509-SVID: %w", err)
	}
	patterns := make([]pattern, 0, len(servers))
	for _, s := range servers {
		p, err := parsePattern(s)
		if err != nil {
			return err
		}
		patterns = append(patterns, p)
	}
	var serverID spiffeid.ID
	authorize := func(id spiffeid.ID, _ [][]*x509.Certificate) error {
		for _, p := range patterns {
			if p.matches(own.ID.TrustDomain(), id) {
				serverID = id
				return nil
			}
		}
		return fmt.Errorf("unauthorized artifact server SPIFFE ID %q (authorized: %s)", id, servers.String())
	}
	config := tlsconfig.MTLSClientConfig(source, source, tlsconfig.Authorizer(authorize))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: config, ForceAttemptHTTP2: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("fetching %s as %s: %w", target, own.ID, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading %s: %w", target, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching %s: %s", target, resp.Status)
	}
	if *output != "" {
		if err := os.WriteFile(*output, body, 0o600); err != nil {
			return err
		}
	}
	sum := sha256.Sum256(body)
	leaf := resp.TLS.PeerCertificates[0]
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"status":         resp.StatusCode,
		"serverSerial":   leaf.SerialNumber.String(),
		"serverNotAfter": leaf.NotAfter.UTC().Format(time.RFC3339),
		"proto":          resp.Proto,
		"tls":            tls.VersionName(resp.TLS.Version),
		"serverID":       serverID.String(),
		"clientID":       own.ID.String(),
		"bytes":          len(body),
		"sha256":         hex.EncodeToString(sum[:]),
	})
}

// pattern is one authorized SPIFFE ID in Flux's syntax.
type pattern struct {
	self   bool
	domain string
	path   string // "" for the whole trust domain
	prefix bool   // path ends in "/"
}

func parsePattern(s string) (pattern, error) {
	rest, ok := strings.CutPrefix(s, "spiffe://")
	if !ok {
		return pattern{}, fmt.Errorf("invalid SPIFFE ID %q: it must start with spiffe://", s)
	}
	domain, path, _ := strings.Cut(rest, "/")
	if path != "" || strings.HasSuffix(rest, "/") {
		path = "/" + path
	}
	p := pattern{self: domain == "self", domain: domain, path: path, prefix: strings.HasSuffix(path, "/")}
	check := s
	if p.self {
		check = "spiffe://self.invalid" + path
	}
	if _, err := spiffeid.FromString(strings.TrimSuffix(check, "/")); err != nil {
		return pattern{}, fmt.Errorf("invalid SPIFFE ID %q: %w", s, err)
	}
	return p, nil
}

func (p pattern) matches(own spiffeid.TrustDomain, id spiffeid.ID) bool {
	domain := p.domain
	if p.self {
		domain = own.Name()
	}
	if id.TrustDomain().Name() != domain {
		return false
	}
	switch {
	case p.path == "":
		return true
	case p.prefix:
		return strings.HasPrefix(id.Path(), p.path)
	default:
		return id.Path() == p.path
	}
}
