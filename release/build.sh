#!/usr/bin/env bash
# Makes pglease's release artifacts from this checkout, into release/out/:
#   pglease-<version>-<arch>-linux.tar.gz   bin/pglease, man pages, shell completions, the
#                                           systemd unit and its configuration, and under
#                                           share/doc/pglease the README, docs/ and licences
#   pglease_<version>-1_<arch>.deb          the same for Debian and Ubuntu CI hosts: /usr/bin,
#                                           the unit enabled and started, a token made
#   pglease_bin-<version>-py3-none-manylinux2014_<arch>.manylinux_2_17_<arch>.whl
#                                           the binary as a Python wheel: `pip install`
#                                           puts pglease on the environment's PATH
#   pytest_pglease-<version>-py3-none-any.whl  the pytest plugin, which depends on it
#   goproxy/                                the Go helper as a module proxy directory
#                                           (release/go.sh): GOPROXY=file://…/goproxy
#   pglease-<version>.tgz, pglease-client-<version>.tgz, pglease-linux-x64-<version>.tgz
#                                           the npm packages (release/npm.sh, from the same
#                                           binary): pglease, @pglease/client, the binary's
#   SHA256SUMS                              sha256sum -c SHA256SUMS checks them
# The tarball is reproducible from a commit: sorted entries, owner root, every mtime the
# commit's time (SOURCE_DATE_EPOCH when set).
#
#   bash release/build.sh              # build, then package
#   bash release/build.sh --image      # also the container image archive: deploy/test.sh
#                                      # --build-only, then release/image.sh (docker)
#
# One build makes the binary every artifact carries: maturin builds the wheel with zig as
# the C compiler and linker against glibc 2.17's symbols (manylinux2014), so the binary runs
# on any Linux of the last decade, not only on one as new as the build machine (2.36 here).
# It needs maturin and ziglang from PyPI: python3 -m pip install 'maturin[zig]'. A second
# run compiles nothing unless the sources changed.
#
# release/check.sh installs the tarball into an empty prefix and runs the README's first flow;
# release/check-npm.sh installs the npm packages into a fresh npm prefix and runs vitest and jest;
# deploy/systemd/boot-test.sh with PGLEASE_DEB installs the package under a real systemd.
set -euo pipefail
cd "$(dirname "$0")/.."
. release/lib.sh

image=0
for arg in "$@"; do
  case "$arg" in
    --image) image=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "release/build.sh: unknown argument $arg (see --help)" >&2; exit 64 ;;
  esac
done

version=$(workspace_version)
arch=$(uname -m)
name="pglease-$version-$arch-linux"
out=release/out
stage="$out/stage/$name"
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

plugin_version=$(awk -F'"' '/^version *=/ { print $2; exit }' clients/python/pyproject.toml)
if [ "$plugin_version" != "$version" ]; then
  echo "release/build.sh: clients/python is at $plugin_version, the workspace at $version: make them equal" >&2
  exit 1
fi

target="$arch-unknown-linux-gnu"

# Every tool the steps below need, checked before the build: a missing one used to show only
# after the release compile (minutes). README.md's "Install" names them too.
missing=()
command -v cargo >/dev/null || missing+=("cargo (a Rust toolchain 1.88+: rustup)")
command -v maturin >/dev/null && python3 -c 'import ziglang' 2>/dev/null \
  || missing+=("maturin and ziglang (python3 -m pip install 'maturin[zig]')")
command -v cargo-deb >/dev/null || missing+=("cargo-deb (cargo install cargo-deb --locked)")
command -v npm >/dev/null || missing+=("npm (Node.js 20 or newer)")
command -v python3 >/dev/null || missing+=("python3 (maturin; the Go helper's module zip, release/go.sh)")
if [ "$image" = 1 ]; then
  command -v docker >/dev/null || missing+=("docker (--image: Debian's docker.io, dockerd running)")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "release/build.sh: missing prerequisites, nothing was built:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi

# The build: pglease-bin, the release binary as maturin packs it (bindings = "bin",
# release/python). maturin's cargo must see the same environment at every run:
# SOURCE_DATE_EPOCH would make cc's build scripts (ring, zstd, liblzma) and all above them
# compile again (maturin dates a wheel's entries 1980 on its own).
mkdir -p "$out"
rm -f "$out"/*.whl
echo "==> maturin build --release --zig --target $target (pglease-bin; the binary)" >&2
(cd release/python && maturin build --quiet --release --zig --target "$target" \
  --compatibility manylinux2014 --out "../../$out") >&2
binary=target/$target/release/pglease
[ -x "$binary" ] || { echo "release/build.sh: maturin left no $binary" >&2; exit 1; }
check_glibc_floor "$binary"
glibc=$(glibc_needed "$binary")

echo "==> staging $name" >&2
rm -rf "$out/stage" && mkdir -p "$stage"
install -D -m 0755 "$binary" "$stage/bin/pglease"
"$stage/bin/pglease" man --out-dir "$stage/share/man/man1" >/dev/null
gzip -n -9 "$stage"/share/man/man1/*.1
"$stage/bin/pglease" completions bash | install -D -m 0644 /dev/stdin "$stage/share/bash-completion/completions/pglease"
"$stage/bin/pglease" completions zsh | install -D -m 0644 /dev/stdin "$stage/share/zsh/site-functions/_pglease"
"$stage/bin/pglease" completions fish | install -D -m 0644 /dev/stdin "$stage/share/fish/vendor_completions.d/pglease.fish"
install -D -m 0644 deploy/systemd/pglease.service "$stage/lib/systemd/system/pglease.service"
# Its configuration goes to /etc/pglease (ConfigurationDirectory=), not under the prefix.
install -D -m 0644 deploy/systemd/pglease.toml "$stage/share/doc/pglease/examples/pglease.toml"
# Where the unit's Documentation= and --help's "docs/…" point: share/doc/pglease.
install -D -m 0644 -t "$stage/share/doc/pglease" README.md LICENSE-MIT LICENSE-APACHE
install -D -m 0644 -t "$stage/share/doc/pglease/docs" docs/*.md

mkdir -p "$out"
tarball="$out/$name.tar.gz"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
  -C "$out/stage" -cf - "$name" | gzip -n -9 > "$tarball"
rm -rf "$out/stage"
echo "==> $tarball ($(du -h "$tarball" | cut -f1); needs glibc $glibc or newer)" >&2

# The Debian package: cargo-deb ([package.metadata.deb] in Cargo.toml) from the same binary,
# with the unit pointing at /usr/bin and the pages and completions generated here.
rm -rf "$out/deb" && mkdir -p "$out/deb/man"
"$binary" man --out-dir "$out/deb/man" >/dev/null
gzip -n -9 "$out"/deb/man/*.1
"$binary" completions bash > "$out/deb/pglease.bash"
"$binary" completions zsh > "$out/deb/_pglease"
"$binary" completions fish > "$out/deb/pglease.fish"
sed -e 's|/usr/local/bin/pglease|/usr/bin/pglease|g' -e 's|/usr/local/share/doc|/usr/share/doc|g' \
  deploy/systemd/pglease.service > "$out/deb/pglease.service"
rm -f "$out"/pglease_*.deb
grep -qF "libc6 (>= $GLIBC_FLOOR)" Cargo.toml || {
  echo "release/build.sh: [package.metadata.deb] depends must say libc6 (>= $GLIBC_FLOOR) (release/lib.sh)" >&2
  exit 1
}
SOURCE_DATE_EPOCH=$epoch cargo deb -p pglease --no-build --target "$target" --output "$out/" >&2
deb=$(ls "$out"/pglease_*.deb)
rm -rf "$out/deb"
echo "==> $deb ($(du -h "$deb" | cut -f1))" >&2

# pytest-pglease, the plugin that depends on pglease-bin at this version.
rm -f "$out"/pytest_pglease-*.whl
echo "==> pip wheel ./clients/python (pytest-pglease)" >&2
python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$out" ./clients/python >&2
rm -rf clients/python/build clients/python/*.egg-info
wheels=$(cd "$out" && ls pglease_bin-"$version"-*.whl pytest_pglease-"$version"-*.whl)
echo "==> $(echo $wheels)" >&2

rm -rf "$out/goproxy"
goproxy=$(bash release/go.sh --out "$out/goproxy")

mapfile -t go_files < <(cd "$out" && find goproxy -type f -name 'v*' | sort)
(cd "$out" && sha256sum "$name.tar.gz" "$(basename "$deb")" $wheels "${go_files[@]}" > SHA256SUMS)
echo "$tarball"
echo "$deb"
for wheel in $wheels; do echo "$out/$wheel"; done
echo "$goproxy"

# The npm packages from the same binary; release/npm.sh adds them to SHA256SUMS.
echo "==> release/npm.sh" >&2
bash release/npm.sh --binary "$binary"

# The container image, built as deploy/test.sh builds it, saved as an archive and checked by
# loading it back (release/image.sh adds it to SHA256SUMS).
if [ "$image" = 1 ]; then
  echo "==> deploy/test.sh --build-only; release/image.sh" >&2
  bash deploy/test.sh --build-only >&2
  bash release/image.sh >&2
  ls "$out"/pglease-image-"$version"-*.tar.gz
fi
