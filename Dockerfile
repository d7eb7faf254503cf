# syntax=docker/dockerfile:1
# node-holder's container image: a static Rust build (glibc's crt-static) on
# an empty base, run as the non-root user 65532; no shell, no libraries.
#
#   docker build -t node-holder:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/node-holder:0.1.0 --push .
#
# The build stage runs on the builder's own platform (BUILDPLATFORM) and
# cross-compiles for the image's (TARGETARCH) with Debian's cross toolchain
# (docker/rust-target.sh says which): no emulation, and a multi-platform build
# runs the compiler natively for every platform. The release workflow
# (.github/workflows/release.yml) builds linux/amd64 and linux/arm64.
#
# BINARY_FROM=prebuilt takes a static binary built beforehand, `node-holder`
# at the build context's root, instead of the build stage's: what `cargo xtask
# image` and the test suite build with buildah, which then build only the
# stages below that one (the runtime stage is the same either way).
# The chart runs it as `node-holder serve` with a read-only root filesystem.
ARG BINARY_FROM=build

FROM --platform=$BUILDPLATFORM docker.io/library/rust:1.95-bookworm AS build
# cargo-auditable embeds the binary's dependency list (crates and versions) in
# the binary itself, where the SBOM scanner (buildx --sbom) reads it. Before
# TARGETARCH: one layer for every platform.
RUN cargo install cargo-auditable --locked --version 0.7.7
ARG TARGETARCH
WORKDIR /src
COPY docker/rust-target.sh /usr/local/bin/rust-target
# The target's standard library, and the cross compiler and C library when
# the target's architecture is not the builder's (ring compiles C and
# assembly for the target; the static link takes the C library's archive).
RUN set -eu; \
    target_env="$(rust-target "$TARGETARCH")"; eval "$target_env"; \
    if [ "$(dpkg --print-architecture)" != "$TARGETARCH" ]; then \
      apt-get update; \
      apt-get install -y --no-install-recommends $CROSS_PACKAGES; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    rustup target add "$RUST_TARGET"
# The whole workspace: Cargo resolves every member's manifest (and the
# benches the root manifest declares) even to build one binary.
COPY . .
# One target directory for every platform: Cargo's own lock orders the
# platforms' builds, and each writes under target/<triple>/.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    set -eu; \
    target_env="$(rust-target "$TARGETARCH")"; eval "$target_env"; \
    RUSTFLAGS="-C target-feature=+crt-static" \
      cargo auditable build --release --locked --package node-holder --bin node-holder --target "$RUST_TARGET"; \
    install -D -m 0755 "target/$RUST_TARGET/release/node-holder" /out/node-holder

FROM scratch AS prebuilt
COPY node-holder /out/node-holder

FROM ${BINARY_FROM} AS binary

FROM scratch
# The user 65532 (nonroot) by name, for tools that read /etc/passwd.
COPY --chmod=0644 docker/etc/passwd docker/etc/group /etc/
COPY --from=binary --chmod=0755 /out/node-holder /usr/local/bin/node-holder
USER 65532:65532
# 8443: the HTTPS admission webhook; 8080: /healthz, /readyz, /metrics.
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/node-holder"]
CMD ["serve"]
