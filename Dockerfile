# syntax=docker/dockerfile:1
# The two images of openflux, built from a clone of this repository:
#
#   docker build --build-arg OPENFLUX_BUILD_COMMIT="$(git rev-parse HEAD)" -t openflux:0.2.0 .
#   docker build --build-arg OPENFLUX_BUILD_COMMIT="$(git rev-parse HEAD)" \
#     --target http-source -t openflux-http-source:0.2.0 .
#
# `make images` builds the same two images without a container engine
# (CONTRIBUTING.md, "Images"); releases are made by `make release`
# (docs/release.md), not from this file. Both binaries are built once, in
# one stage, for the build platform's architecture, and run on distroless
# cc: glibc and libgcc of the same Debian release as the build stage, CA
# roots, and the non-root user 65532. The context holds what cargo reads
# (.dockerignore): the workspace's manifests and lock file, the build
# script, the sources and the benches the root manifest declares; not .git,
# so `--version` names the commit given as OPENFLUX_BUILD_COMMIT ("unknown"
# without it).

ARG RUST_VERSION=1.95
ARG BASE=gcr.io/distroless/cc-debian12:nonroot

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY benches ./benches
COPY crates ./crates
ARG OPENFLUX_BUILD_COMMIT=
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p openflux -p openflux-http-source --bins \
    && install -D -m 0755 target/release/openflux /out/openflux \
    && install -D -m 0755 target/release/openflux-http-source /out/openflux-http-source

# The HttpSource controller fetches from HTTP(S) URLs: it uses the base's CA
# roots (/etc/ssl/certs/ca-certificates.crt); see docs/http-source.md for a
# private CA.
FROM ${BASE} AS http-source
COPY --from=build /out/openflux-http-source /openflux-http-source
USER 65532:65532
# artifact server, metrics, health
EXPOSE 9090 8080 9440
LABEL org.opencontainers.image.title="openflux-http-source" \
      org.opencontainers.image.description="HttpSource: the reference custom source for openflux, built on openflux-api alone" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.2.0"
ENTRYPOINT ["/openflux-http-source"]

# The default target: openflux (webhook, mirror and export controllers).
FROM ${BASE} AS openflux
COPY --from=build /out/openflux /openflux
USER 65532:65532
# webhook, metrics, health
EXPOSE 9443 8080 9440
LABEL org.opencontainers.image.title="openflux" \
      org.opencontainers.image.description="Opens upstream Flux to custom source types: Artifact mirror, export to Flux-consumable objects and a mutating webhook" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.2.0"
ENTRYPOINT ["/openflux"]
