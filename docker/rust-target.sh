#!/bin/sh
# The Rust target and Debian's cross toolchain for an image platform's
# architecture (buildx's TARGETARCH), as shell assignments for `eval`:
#
#   eval "$(rust-target.sh arm64)"
#
# sets and exports RUST_TARGET (aarch64-unknown-linux-gnu), CROSS_PACKAGES
# (the Debian packages that compile and link for it on another architecture)
# and the linker, C compiler and archiver Cargo and the cc crate (ring's build
# script) use for that target. On a builder of the same architecture those
# tools are the native ones under their target-prefixed names (Debian's gcc
# ships them), so one build command serves both. The Dockerfile runs it.
set -eu

arch=${1:?usage: rust-target.sh TARGETARCH (amd64 or arm64)}
case "$arch" in
  amd64)
    target=x86_64-unknown-linux-gnu
    gnu=x86_64-linux-gnu
    packages="gcc-x86-64-linux-gnu libc6-dev-amd64-cross"
    ;;
  arm64)
    target=aarch64-unknown-linux-gnu
    gnu=aarch64-linux-gnu
    packages="gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
    ;;
  *)
    echo "rust-target.sh: no Rust target for architecture '$arch' (amd64, arm64)" >&2
    exit 1
    ;;
esac
# Cargo's CARGO_TARGET_<TRIPLE>_LINKER, the cc crate's CC_<triple>, AR_<triple>.
upper=$(echo "$target" | tr 'a-z-' 'A-Z_')
lower=$(echo "$target" | tr '-' '_')
echo "export RUST_TARGET=$target"
echo "export CROSS_PACKAGES='$packages'"
echo "export CARGO_TARGET_${upper}_LINKER=$gnu-gcc"
echo "export CC_${lower}=$gnu-gcc"
echo "export AR_${lower}=$gnu-ar"
