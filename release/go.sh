#!/usr/bin/env bash
# Makes the Go helper (clients/go) a module that `go get` can fetch without the repository:
# a directory laid out as the module proxy protocol says (`go help goproxy`), by default
# release/out/goproxy:
#   github.com/pglease/pglease/clients/go/@v/list           the versions, one a line
#   github.com/pglease/pglease/clients/go/@v/vX.Y.Z.info    {"Version", "Time"}
#   github.com/pglease/pglease/clients/go/@v/vX.Y.Z.mod     its go.mod
#   github.com/pglease/pglease/clients/go/@v/vX.Y.Z.zip     its files, each under
#                                                           <module>@vX.Y.Z/
# The version is the workspace's (Cargo.toml); published, it is the tag clients/go/vX.Y.Z
# in the project's repository (README.md, "Where it lives"). The zip holds what Go's own
# zips hold: the module's files without the nested module examples/ (its own go.mod) and
# without anything that is not a regular file. Same commit, same bytes: entries sorted, every
# time the commit's (SOURCE_DATE_EPOCH when set).
#
#   bash release/go.sh [--out DIR]
#   GOPROXY=file://$PWD/release/out/goproxy GONOSUMDB=github.com/pglease/pglease \
#     go get github.com/pglease/pglease/clients/go@v0.1.0
#
# GONOSUMDB: the public checksum database knows no module that is not published.
# tests/it/packaging.rs makes one and fetches from it in a fresh module.
set -euo pipefail
cd "$(dirname "$0")/.."
. release/lib.sh

out=release/out/goproxy
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "release/go.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done

version=v$(workspace_version)
module=$(awk '$1 == "module" { print $2; exit }' clients/go/go.mod)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

# The files: git's list in a checkout (what a tag would hold), else every file.
if git -C clients/go rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git -C clients/go ls-files)
else
  files=$(cd clients/go && find . -type f | sed 's|^\./||')
fi

dir="$out/$module/@v"
mkdir -p "$dir"
cp clients/go/go.mod "$dir/$version.mod"
# The zip as golang.org/x/mod/zip makes it; the file list comes on stdin.
zip_module='
import os, sys, time, zipfile
zip_path, prefix, epoch = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = [line for line in sys.stdin.read().split("\n") if line]
# A directory below the root with a go.mod of its own is another module.
nested = {os.path.dirname(f) for f in files if os.path.basename(f) == "go.mod" and os.path.dirname(f)}
def inside_nested(path):
    return any(path.startswith(n + "/") for n in nested)
stamp = time.gmtime(max(epoch, 315532800))[:6]  # zip times start in 1980
with zipfile.ZipFile(zip_path, "w") as z:
    for name in sorted(f for f in files if not inside_nested(f)):
        path = os.path.join("clients/go", name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        info = zipfile.ZipInfo(prefix + "/" + name, date_time=stamp)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o644 << 16
        with open(path, "rb") as f:
            z.writestr(info, f.read())
'
printf '%s\n' "$files" | python3 -c "$zip_module" "$dir/$version.zip" "$module@$version" "$epoch"
printf '{"Version":"%s","Time":"%s"}\n' "$version" "$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)" >"$dir/$version.info"
# Other versions already in the directory stay listed.
{ cat "$dir/list" 2>/dev/null || true; echo "$version"; } | sort -uV >"$dir/list.new"
mv "$dir/list.new" "$dir/list"
echo "==> $dir/$version.zip ($(du -h "$dir/$version.zip" | cut -f1); $(python3 -c 'import sys, zipfile; print(len(zipfile.ZipFile(sys.argv[1]).namelist()))' "$dir/$version.zip") files)" >&2
echo "$out"
