# What the release scripts (and deploy/test.sh) share; sourced from the checkout's root:
#   . release/lib.sh

# The version every artifact carries: [workspace.package] version in Cargo.toml.
workspace_version() {
  awk -F'"' '/^\[workspace.package\]/ { section = 1; next } /^\[/ { section = 0 } section && /^version *=/ { print $2; exit }' Cargo.toml
}

# The oldest glibc a released binary may need: what the wheel's tag (manylinux2014), the
# npm platform package and the docs promise (the .deb's Depends in Cargo.toml says it too).
GLIBC_FLOOR=2.17

# The newest glibc symbol version binary $1 needs ("2.17"), empty for a static binary.
glibc_needed() {
  objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1 || true
}

# Fails, saying so, when binary $1 needs a newer glibc than GLIBC_FLOOR.
check_glibc_floor() {
  local needed
  needed=$(glibc_needed "$1")
  if [ -n "$needed" ] && [ "$(printf '%s\n%s\n' "$needed" "$GLIBC_FLOOR" | sort -V | tail -1)" != "$GLIBC_FLOOR" ]; then
    echo "$1 needs glibc $needed, newer than the $GLIBC_FLOOR the release promises" >&2
    return 1
  fi
}
