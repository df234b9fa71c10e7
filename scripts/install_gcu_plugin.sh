#!/usr/bin/env bash
# Install Enflame's paddle-custom-gcu plug-in wheel into .venv together with the paddlepaddle release
# it was built against (the plug-in and paddle must match; the CPU pin in pyproject.toml is replaced),
# then run the engine's start-up version check once.
#   scripts/install_gcu_plugin.sh /path/to/paddle_custom_gcu-3.1.1-cp311-cp311-linux_x86_64.whl
# Environment: PADDLE_INDEX_URL (optional) extra index for the paddlepaddle wheel, e.g. Paddle's own CPU
# index as FastDeploy's GCU guide uses; PADDLE_VERSION overrides the version read from the wheel.
# Run after scripts/setup.sh. A later `FORCE=1 scripts/setup.sh` re-installs the CPU pin: run this again.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VPY=$ROOT/.venv/bin/python
wheel=${1:?usage: scripts/install_gcu_plugin.sh <paddle_custom_gcu-*.whl>}
[[ -f $wheel ]] || { echo "install_gcu_plugin: $wheel not found" >&2; exit 1; }
[[ -x $VPY ]] || { echo "install_gcu_plugin: run scripts/setup.sh first" >&2; exit 1; }

# The plug-in's version from the wheel's own metadata (its file name may be renamed).
plugin_version=$("$VPY" - "$wheel" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    fields = dict(l.split(": ", 1) for l in z.read(meta).decode().splitlines() if ": " in l)
if fields.get("Name", "").replace("_", "-").lower() != "paddle-custom-gcu":
    sys.exit(f"install_gcu_plugin: {sys.argv[1]} is {fields.get('Name')!r}, not paddle-custom-gcu")
print(fields["Version"])
PYEOF
)
# paddle-custom-gcu X.Y.Z is released against paddlepaddle X.Y.Z (FastDeploy's GCU guide: 3.1.1 + 3.1.1).
paddle_version=${PADDLE_VERSION:-${plugin_version%%[+-]*}}
echo "install_gcu_plugin: paddle-custom-gcu $plugin_version -> paddlepaddle $paddle_version"
extra=()
[[ -n ${PADDLE_INDEX_URL:-} ]] && extra=(--extra-index-url "$PADDLE_INDEX_URL")
"$VPY" -m pip install -q "${extra[@]}" "paddlepaddle==$paddle_version"
"$VPY" -m pip install -q --no-deps "$wheel"
"$VPY" -c 'from paddle_llm_engine.platforms import check_gcu_versions; check_gcu_versions(); print("install_gcu_plugin: versions accepted")'
