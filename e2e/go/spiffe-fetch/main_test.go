package main

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

func TestPatternsMatchAsFluxDocuments(t *testing.T) {
	own := spiffeid.RequireTrustDomainFromString("own.example")
	cases := []struct {
		pattern, id string
		want        bool
	}{
		{"spiffe://td.example", "spiffe://td.example/a/b", true},
		{"spiffe://td.example", "spiffe://other.example/a", false},
		{"spiffe://td.example/a/b", "spiffe://td.example/a/b", true},
		{"spiffe://td.example/a/b", "spiffe://td.example/a/bc", false},
		{"spiffe://td.example/a/b", "spiffe://td.example/a/b/c", false},
		{"spiffe://td.example/a/", "spiffe://td.example/a/b", true},
		{"spiffe://td.example/a/", "spiffe://td.example/ab", false},
		{"spiffe://self", "spiffe://own.example/x", true},
		{"spiffe://self/x/", "spiffe://own.example/x/y", true},
		{"spiffe://self/x/", "spiffe://td.example/x/y", false},
	}
	for _, c := range cases {
		p, err := parsePattern(c.pattern)
		if err != nil {
			t.Fatalf("%s: %v", c.pattern, err)
		}
		if got := p.matches(own, spiffeid.RequireFromString(c.id)); got != c.want {
			t.Errorf("%s vs %s: got %v, want %v", c.pattern, c.id, got, c.want)
		}
	}
	for _, bad := range []string{"https://td.example/a", "spiffe://TD/a", "spiffe://td.example/a//b", "spiffe://td.example/../a"} {
		if _, err := parsePattern(bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
