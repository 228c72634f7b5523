#!/usr/bin/env bash
# The Debian packages the test suite needs: chromium (browser tests), redis-server (Redis tier tests),
# postgresql (catalog/queue tests), docker-compose and caddy (the compose file and Caddyfile are validated,
# nothing is built or run). Run by `make test` before pytest; `make serve` does not need them.
#
# Missing packages are installed when this runs as root with apt-get (one `apt-get update`, then one
# `apt-get install` of what is missing); otherwise it stops with one line naming what to install.
#
#   scripts/system-deps.sh            check, install as root, or fail with the apt-get command to run
#   scripts/system-deps.sh --dry-run  say what would be run, change nothing
#
# SYSDEPS_ROOT (default empty) prefixes every checked path; tests point it at a fake file tree.
set -euo pipefail

dry_run=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "system-deps.sh: unknown argument $arg (use --dry-run)" >&2; exit 2 ;;
  esac
done

root="${SYSDEPS_ROOT:-}"

# package name → whether its binary is present
has() {
  case "$1" in
    chromium) [ -x "$root/usr/bin/chromium" ] ;;
    redis-server) [ -x "$root/usr/bin/redis-server" ] ;;
    postgresql) compgen -G "$root/usr/lib/postgresql/*/bin/initdb" >/dev/null ;;
    docker-compose) [ -x "$root/usr/bin/docker-compose" ] ;;
    caddy) [ -x "$root/usr/bin/caddy" ] ;;
  esac
}

missing() {
  local pkg out=()
  for pkg in chromium redis-server postgresql docker-compose caddy; do
    has "$pkg" || out+=("$pkg")
  done
  echo "${out[@]:-}"
}

need="$(missing)"
if [ -z "$need" ]; then
  # Said in a dry run (which is asked for an answer); a real run stays quiet so `make test` output is short.
  if [ "$dry_run" = 1 ]; then
    echo "all present: chromium redis-server postgresql docker-compose caddy"
  fi
  exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: the tests need Debian packages that are missing: run \`sudo apt-get install -y $need\` (or as root: make test)" >&2
  exit 1
fi

if [ "$dry_run" = 1 ]; then
  echo "would run: apt-get update -qq"
  echo "would run: apt-get install -y -qq $need"
  exit 0
fi

echo "installing Debian packages the tests need: $need" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086  # word splitting of the package list is intended
apt-get install -y -qq $need >/dev/null

still="$(missing)"
if [ -n "$still" ]; then
  echo "error: apt-get install finished but these are still missing: $still" >&2
  exit 1
fi
