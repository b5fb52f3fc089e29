#!/usr/bin/env bash
# The container image as an archive for machines without a registry: tags the image
# deploy/test.sh built (pglease:local; it tags pglease:<version> too) as pglease:<version>,
# the tag compose and the Kubernetes files name, saves it into
# release/out/pglease-image-<version>-<arch>.tar.gz (adding it to SHA256SUMS), then checks
# it as such a machine would use it: the tag removed, `docker load` from the archive, a
# container started from the loaded image, ready, and a lease through its API.
#
#   bash release/image.sh     # after deploy/test.sh and release/build.sh
#
# After `docker load`, compose's default image (PGLEASE_IMAGE unset) is this one; the
# Kubernetes files name it in your registry (registry.example.invalid/pglease:<version>).
set -euo pipefail
cd "$(dirname "$0")/.."
. release/lib.sh

docker=${DOCKER:-docker}
[ -x /usr/bin/docker ] && [ -z "${DOCKER:-}" ] && docker=/usr/bin/docker
source_image=${PGLEASE_IMAGE:-pglease:local}
version=$(workspace_version)
tag="pglease:$version"
out=release/out
archive="$out/pglease-image-$version-$(uname -m).tar.gz"
name=pglease-image-check-$$

"$docker" image inspect "$source_image" >/dev/null 2>&1 \
  || { echo "release/image.sh: no image $source_image (run deploy/test.sh)" >&2; exit 1; }
mkdir -p "$out"
"$docker" tag "$source_image" "$tag"
echo "==> docker save $tag > $archive" >&2
"$docker" save "$tag" | gzip -n -6 > "$archive"
(cd "$out" && { grep -vF "$(basename "$archive")" SHA256SUMS 2>/dev/null || true; sha256sum "$(basename "$archive")"; } > SHA256SUMS.new && mv SHA256SUMS.new SHA256SUMS)

cleanup() {
  "$docker" rm -f "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT
echo "==> docker load from the archive, as a machine without a registry" >&2
"$docker" rmi "$tag" >/dev/null
(cd "$out" && grep -F "$(basename "$archive")" SHA256SUMS | sha256sum --quiet -c -)
"$docker" load -i "$archive"
"$docker" image inspect "$tag" >/dev/null

token=image-check-token
"$docker" run -d --name "$name" -e PGLEASE_TOKEN="$token" --tmpfs /var/lib/pglease:size=1g \
  --tmpfs /var/lib/pglease/databases:size=1g "$tag" >/dev/null
for _ in $(seq 1 150); do
  status=$("$docker" inspect -f '{{.State.Health.Status}}' "$name" 2>/dev/null || echo missing)
  [ "$status" = healthy ] && break
  [ "$("$docker" inspect -f '{{.State.Running}}' "$name")" = true ] || break
  sleep 0.4
done
if [ "$status" != healthy ]; then
  echo "release/image.sh: the loaded image's container is not healthy ($status); its log:" >&2
  "$docker" logs "$name" 2>&1 | tail -n 30 >&2
  exit 1
fi
# The image has no curl: its own client leases (PGLEASE_TOKEN is set in the container).
lease=$("$docker" exec "$name" pglease lease)
case "$lease" in
  postgresql://*) ;;
  *) echo "release/image.sh: no lease from the loaded image: $lease" >&2; exit 1 ;;
esac
echo "release/image.sh: $(basename "$archive") ($(du -h "$archive" | cut -f1)): loaded, healthy, leased"
