# syntax=docker/dockerfile:1
# The two images of openflux, built from a clone of this repository:
#
#   docker build -t openflux:0.1.0 .
#   docker build --target http-source -t openflux-http-source:0.1.0 .
#
# `make images` builds the same two images without a container engine
# (CONTRIBUTING.md, "Images"). Both binaries are built once, in one stage, for the
# build platform's architecture, and run on distroless cc: glibc and libgcc
# of the same Debian release as the build stage, CA roots, and the non-root
# user 65532.

ARG RUST_VERSION=1.95
ARG BASE=gcr.io/distroless/cc-debian12:nonroot

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY benches ./benches
COPY crates ./crates
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
      org.opencontainers.image.version="0.1.0"
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
      org.opencontainers.image.version="0.1.0"
ENTRYPOINT ["/openflux"]
