#!/usr/bin/env bash
# Validates the manifests of deploy/kubernetes/ offline: kubernetes-validate (PyPI) bundles
# the Kubernetes API's JSON schemas, so no cluster and no network is needed once it is
# installed. --strict makes unknown fields errors; any warning (an unknown kind or
# apiVersion is only a warning to the tool) fails too. Checked against 1.29, the first
# release with native sidecars on by default (sidecar-job.yaml), and the newest release the
# tool knows. Then it checks that the validator does reject broken copies.
set -euo pipefail
cd "$(dirname "$0")"

validator_version=1.37.0
if ! command -v kubernetes-validate >/dev/null; then
  echo "installing kubernetes-validate $validator_version (pip)"
  python3 -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$validator_version"
  scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  export PATH="$PATH:$scripts"
fi
kubernetes_versions=(1.29.0 "$(kubernetes-validate --version | awk '{print $NF}')")

# check FILE VERSION: silent and 0 when FILE is valid for VERSION.
check() {
  local out
  out=$(kubernetes-validate --strict --quiet -k "$2" "$1" 2>&1) || true
  if [ -n "$out" ]; then
    printf '%s\n' "$out"
    return 1
  fi
}

failed=0
for manifest in *.yaml; do
  for version in "${kubernetes_versions[@]}"; do
    if check "$manifest" "$version"; then
      echo "ok: $manifest is valid for Kubernetes $version"
    else
      echo "FAIL: $manifest against Kubernetes $version" >&2
      failed=1
    fi
  done
done
[ "$failed" -eq 0 ] || exit 1

# The validator itself: each of these broken copies must be rejected.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
broken() { # name, sed expression applied to daemonset.yaml
  sed "$2" daemonset.yaml >"$scratch/$1.yaml"
  if cmp -s daemonset.yaml "$scratch/$1.yaml"; then
    echo "FAIL: the broken copy '$1' is unchanged; fix its sed expression" >&2
    exit 1
  fi
  if check "$scratch/$1.yaml" "${kubernetes_versions[-1]}" >/dev/null; then
    echo "FAIL: the validator accepted a manifest with $1" >&2
    exit 1
  fi
  echo "ok: a manifest with $1 is rejected"
}
broken "a misspelt field" 's/sizeLimit:/sizeLimt:/'
broken "a port that is not a number" 's/containerPort: 5480/containerPort: "5480x"/'
broken "an unknown kind" 's/^kind: DaemonSet/kind: DeamonSet/'
broken "no selector" '/^  selector:$/{N;N;/matchLabels/d}'
