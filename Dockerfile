# syntax=docker/dockerfile:1
# node-holder's container image: a static-ish Rust build on Debian 12, run on
# distroless (glibc, CA certificates, no shell) as the non-root user 65532.
#
#   docker build -t node-holder:0.1.0 .
#
# The chart runs it as `node-holder serve` with a read-only root filesystem.

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
# The whole workspace: Cargo resolves every member's manifest (and the
# benches the root manifest declares) even to build one binary.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --package node-holder --bin node-holder \
    && install -D -m 0755 target/release/node-holder /out/node-holder

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/node-holder /usr/local/bin/node-holder
USER 65532:65532
# 8443: the HTTPS admission webhook; 8080: /healthz, /readyz, /metrics.
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/node-holder"]
CMD ["serve"]
