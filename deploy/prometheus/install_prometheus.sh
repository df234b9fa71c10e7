#!/usr/bin/env bash
# Prints the path of a Prometheus binary (last line of stdout), fetching Debian's `prometheus` package
# when none is available. Idempotent: a second run only checks and exits.
#
# Order: $PROMETHEUS (an executable), build/prometheus/usr/bin/prometheus (an earlier run of this
# script), `prometheus` on PATH (e.g. `apt-get install prometheus` by the admin), else Debian's package.
# The package is fetched with `apt-get download` (apt checks it against the signed archive) and unpacked
# with `dpkg-deb -x` into build/prometheus/: nothing is installed system-wide, no prometheus user or
# service is created and no daemon is started (a plain `apt-get install prometheus` on a systemd host
# enables and starts prometheus.service on :9090 for all interfaces, and pulls prometheus-node-exporter).
# The binary is a Go program that needs only libc. `apt-get update` runs first when apt has no package
# lists (a fresh Debian image); that needs root. Any failure exits non-zero with the reason on stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=$ROOT/build/prometheus
BIN=$DEST/usr/bin/prometheus

works() { [[ -x $1 ]] && "$1" --version >/dev/null 2>&1; }

if [[ -n ${PROMETHEUS:-} ]]; then
  works "$PROMETHEUS" || { echo "install_prometheus: PROMETHEUS=$PROMETHEUS does not run" >&2; exit 1; }
  echo "$PROMETHEUS"; exit 0
fi
if works "$BIN"; then echo "$BIN"; exit 0; fi
if sys=$(command -v prometheus) && works "$sys"; then echo "$sys"; exit 0; fi

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
  || { echo "install_prometheus: no prometheus binary and no apt-get / dpkg-deb (not Debian): install Prometheus >= 2.42 and set PROMETHEUS=/path/to/prometheus" >&2; exit 1; }

mkdir -p "$ROOT/build"
work=$(mktemp -d "$ROOT/build/.prometheus-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
# (as root apt warns that the download runs unsandboxed because _apt cannot write here: harmless)
fetch() { (cd "$work" && timeout 300 apt-get download -q prometheus) >&2; }
if ! fetch; then
  if [[ $(id -u) != 0 ]]; then
    echo "install_prometheus: 'apt-get download prometheus' failed and 'apt-get update' needs root: run 'sudo apt-get update' (or install prometheus, or set PROMETHEUS)" >&2
    exit 1
  fi
  echo "install_prometheus: apt-get update (no usable package lists)" >&2
  timeout 300 apt-get update -q >&2 || { echo "install_prometheus: apt-get update failed" >&2; exit 1; }
  fetch || { echo "install_prometheus: 'apt-get download prometheus' failed after apt-get update (is Debian's main archive reachable?)" >&2; exit 1; }
fi
deb=$(ls "$work"/prometheus_*.deb)
rm -rf "$DEST.new" && mkdir -p "$DEST.new"
dpkg-deb -x "$deb" "$DEST.new"
works "$DEST.new/usr/bin/prometheus" || { echo "install_prometheus: the unpacked $(basename "$deb") does not run" >&2; exit 1; }
rm -rf "$DEST" && mv "$DEST.new" "$DEST"
echo "install_prometheus: unpacked $(basename "$deb") into ${DEST#"$ROOT"/}" >&2
echo "$BIN"
