# openflux as a static binary on an empty base image.
#
#   docker build -t openflux .
#
# The binary is built for the build platform's architecture (x86_64 or
# aarch64) against musl, so it needs no libc; TLS uses rustls with ring and
# the API server's CA from the service account, so no CA store either.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, so source changes do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && arch="$(uname -m)" && target="$arch-unknown-linux-musl" \
    && rustup target add "$target" \
    && env "CC_${arch}_unknown_linux_musl=musl-gcc" cargo build --release --locked --target "$target" --bin openflux \
    && rm -rf src
COPY src ./src
RUN arch="$(uname -m)" && target="$arch-unknown-linux-musl" \
    && touch src/main.rs src/lib.rs \
    && env "CC_${arch}_unknown_linux_musl=musl-gcc" cargo build --release --locked --target "$target" --bin openflux \
    && install -D -m 0755 "target/$target/release/openflux" /out/openflux

FROM scratch
COPY --from=build /out/openflux /openflux
USER 65532:65532
EXPOSE 9443 8080 9440
ENTRYPOINT ["/openflux"]
