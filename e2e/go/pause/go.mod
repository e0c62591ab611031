module openflux.dev/e2e/pause

go 1.26.0
