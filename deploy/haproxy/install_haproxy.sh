#!/usr/bin/env bash
# Prints the path of an HAProxy binary (last line of stdout), fetching Debian's `haproxy` package when
# none is available. Idempotent: a second run only checks and exits.
#
# Order: $HAPROXY (an executable), build/haproxy/haproxy (an earlier run of this script), `haproxy` on
# PATH (e.g. `apt-get install haproxy` by the admin), else Debian's package.
# The package is fetched with `apt-get download` (apt checks it against the signed archive) and unpacked
# with `dpkg-deb -x` into build/haproxy/: nothing is installed system-wide, no haproxy user or service is
# created and no daemon is started (a plain `apt-get install haproxy` on a systemd host enables and
# starts haproxy.service with /etc/haproxy/haproxy.cfg). Unlike Prometheus (a static Go binary) HAProxy
# links shared libraries; the ones its package depends on that this host lacks (on bookworm:
# liblua5.3-0, libopentracing-c-wrapper0 and its libopentracing1) are fetched and unpacked beside it the
# same way, and build/haproxy/haproxy is a two-line wrapper that puts them on LD_LIBRARY_PATH. Only `lib*`
# dependencies are followed: the others (adduser, lsb-base, ...) serve the package's maintainer scripts,
# which are never run here. `ldd` then checks that nothing is missing. `apt-get update` runs first when
# apt has no package lists (a fresh Debian image); that needs root. Any failure exits non-zero with the
# reason on stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=$ROOT/build/haproxy
BIN=$DEST/haproxy

works() { [[ -x $1 ]] && "$1" -v >/dev/null 2>&1; }

if [[ -n ${HAPROXY:-} ]]; then
  works "$HAPROXY" || { echo "install_haproxy: HAPROXY=$HAPROXY does not run" >&2; exit 1; }
  echo "$HAPROXY"; exit 0
fi
if works "$BIN"; then echo "$BIN"; exit 0; fi
if sys=$(command -v haproxy) && works "$sys"; then echo "$sys"; exit 0; fi

for tool in apt-get apt-cache dpkg-deb dpkg-query ldd; do
  command -v $tool >/dev/null \
    || { echo "install_haproxy: no haproxy binary and no $tool (not Debian): install HAProxy >= 2.6 and set HAPROXY=/path/to/haproxy" >&2; exit 1; }
done

mkdir -p "$ROOT/build"
work=$(mktemp -d "$ROOT/build/.haproxy-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
# (as root apt warns that the download runs unsandboxed because _apt cannot write here: harmless)
fetch() { (cd "$work" && timeout 300 apt-get download -q "$@") >&2; }
if ! fetch haproxy; then
  if [[ $(id -u) != 0 ]]; then
    echo "install_haproxy: 'apt-get download haproxy' failed and 'apt-get update' needs root: run 'sudo apt-get update' (or install haproxy, or set HAPROXY)" >&2
    exit 1
  fi
  echo "install_haproxy: apt-get update (no usable package lists)" >&2
  timeout 300 apt-get update -q >&2 || { echo "install_haproxy: apt-get update failed" >&2; exit 1; }
  fetch haproxy || { echo "install_haproxy: 'apt-get download haproxy' failed after apt-get update (is Debian's main archive reachable?)" >&2; exit 1; }
fi

# The shared-library packages haproxy needs that are not installed, following their own dependencies
# (first alternative of each; version constraints are the archive's business, it is one release).
installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }
lib_deps() { dpkg-deb -f "$1" Depends | tr ',' '\n' | sed -E 's/\|.*//; s/\(.*\)//; s/:any//; s/[[:space:]]//g' | grep '^lib' || true; }
seen=" haproxy "
queue=$(lib_deps "$work"/haproxy_*.deb)
while [[ -n $queue ]]; do
  next=""
  for pkg in $queue; do
    [[ $seen == *" $pkg "* ]] && continue
    seen+="$pkg "
    installed "$pkg" && continue
    fetch "$pkg" || { echo "install_haproxy: 'apt-get download $pkg' (a library haproxy needs) failed" >&2; exit 1; }
    next+=" $(lib_deps "$work"/"${pkg}"_*.deb)"
  done
  queue=$next
done

rm -rf "$DEST.new" && mkdir -p "$DEST.new"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$DEST.new"; done
libdirs=$(cd "$DEST.new" && find usr/lib -maxdepth 1 -type d -name '*-linux-gnu*' 2>/dev/null | paste -sd' ' -)
# relocatable: the wrapper finds the unpacked tree from its own path
cat > "$DEST.new/haproxy" <<EOF
#!/bin/sh
# Debian's haproxy unpacked by deploy/haproxy/install_haproxy.sh, with the libraries unpacked beside it.
here=\$(dirname "\$(readlink -f "\$0")")
for d in $libdirs; do LD_LIBRARY_PATH="\$here/\$d\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"; done
export LD_LIBRARY_PATH
exec "\$here/usr/sbin/haproxy" "\$@"
EOF
chmod +x "$DEST.new/haproxy"
libpath=$(for d in $libdirs; do printf '%s:' "$DEST.new/$d"; done)
missing=$(LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:-}" ldd "$DEST.new/usr/sbin/haproxy" | grep 'not found' || true)
[[ -z $missing ]] || { echo "install_haproxy: the unpacked haproxy still lacks libraries:" >&2; echo "$missing" >&2; exit 1; }
rm -rf "$DEST" && mv "$DEST.new" "$DEST"
works "$BIN" || { echo "install_haproxy: the unpacked $(basename "$work"/haproxy_*.deb) does not run" >&2; exit 1; }
echo "install_haproxy: unpacked $(cd "$work" && ls -- *.deb | paste -sd' ' -) into ${DEST#"$ROOT"/}" >&2
echo "$BIN"
