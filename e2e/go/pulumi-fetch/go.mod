module openflux.dev/e2e/pulumi-fetch

go 1.26.0

require github.com/fluxcd/pkg/http/fetch v0.11.0

require (
	github.com/cyphar/filepath-securejoin v0.2.4 // indirect
	github.com/fluxcd/pkg/tar v0.7.0 // indirect
	github.com/go-logr/logr v1.4.1 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.5 // indirect
	github.com/klauspost/cpuid/v2 v2.2.6 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/go-digest/blake3 v0.0.0-20231025023718-d50d2fec9c98 // indirect
	github.com/zeebo/blake3 v0.2.3 // indirect
	golang.org/x/sys v0.19.0 // indirect
)

// As github.com/fluxcd/pkg/http/fetch v0.11.0 replaces it (BLAKE3 registration).
replace github.com/opencontainers/go-digest => github.com/opencontainers/go-digest v1.0.1-0.20220411205349-bde1400a84be
