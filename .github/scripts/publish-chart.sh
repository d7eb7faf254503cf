#!/usr/bin/env bash
# Packages chart/ at VERSION (the chart's version and appVersion) with
# `helm package` and pushes it with `helm push` to the OCI repository REPO
# (oci://REGISTRY/PATH). Prints the pushed chart by digest,
# oci://REGISTRY/PATH/node-holder@sha256:..., on standard output; what helm
# says goes to standard error.
#
#   publish-chart.sh VERSION oci://REGISTRY/PATH [helm push flags...]
#
# The release workflow (.github/workflows/release.yml) runs it, and so does the
# real-node install test (tests/real_install.rs), against a local registry
# with --plain-http. HELM names the helm to run (default: helm on PATH).
set -euo pipefail

die() {
  echo "publish-chart.sh: $*" >&2
  exit 1
}

[ "$#" -ge 2 ] || die "usage: publish-chart.sh VERSION oci://REGISTRY/PATH [helm push flags...]"
version=$1
repository=${2%/}
shift 2
semver='^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$'
[[ $version =~ $semver ]] || die "VERSION must be a semantic version (1.2.3, 1.2.3-rc.1), not '$version'"
[[ $repository == oci://?* ]] || die "REPO must be an oci:// reference, not '$repository'"

helm=${HELM:-helm}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$helm" package "$root/chart" --version "$version" --app-version "$version" \
  --destination "$work" >&2
# helm names the package after the chart and the version, with a `+` of the
# version's build metadata as it is.
package="$work/node-holder-$version.tgz"
[ -f "$package" ] || die "helm package wrote no $package"
if ! "$helm" push "$package" "$repository" "$@" >"$work/push.log" 2>&1; then
  cat "$work/push.log" >&2
  die "helm push to $repository failed"
fi
cat "$work/push.log" >&2
digest=$(sed -n 's/^Digest: *//p' "$work/push.log")
[[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "helm push told no digest"
echo "$repository/node-holder@$digest"
