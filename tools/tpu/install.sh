#!/usr/bin/env bash
# Install Theseus on a TPU host without network, beside the host's own JAX.
#
#   bash tools/tpu/install.sh [WHEELS [SITE]]
#
# WHEELS is the folder tools/tpu/pack.py wrote on a machine with network (default:
# .whl-tpu at the repository's root); SITE is where to install (default: WHEELS/site), on
# a filesystem that may run code (not a noexec tmpfs such as a TPU VM's /dev/shm).
# 1. the packed wheels (Theseus and what the host lacks), --no-deps, into
#    SITE/packed/site-packages;
# 2. what requirements-host.txt names, from the host's own index (THESEUS_TPU_INDEX,
#    default file:///opt/pypi/simple), into SITE/host/site-packages: resolved within the
#    index alone (its versions fit each other and the host's JAX, which it holds too),
#    then installed less the host's own packages and less what step 1 installed (those
#    come first on PYTHONPATH anyway);
# 3. checks, with both folders appended to PYTHONPATH (the host's JAX stays first), that
#    JAX is still the host's, that it sees a TPU (THESEUS_ACCELERATOR_ALLOW_CPU=1 accepts
#    a CPU), and that Theseus imports from SITE; then prints the lines to export.
# Nothing outside SITE is written. Running it again installs afresh. The folders are
# named site-packages because dill (which datasets, under `theseus eval`, pickles with)
# pickles a module by value, not by name, unless its path says site-packages or lies
# under Python's prefix; pyarrow's modules cannot be pickled by value.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
wheels="$(cd "${1:-$repo/.whl-tpu}" 2>/dev/null && pwd)" || {
  echo "install.sh: no folder ${1:-$repo/.whl-tpu}; run 'uv run python tools/tpu/pack.py' on a machine with network and copy .whl-tpu here" >&2
  exit 1
}
site="${2:-$wheels/site}"
index="${THESEUS_TPU_INDEX:-file:///opt/pypi/simple}"
python="${PYTHON:-python3}"

if [ ! -f "$wheels/packed.json" ] || [ ! -f "$wheels/requirements-host.txt" ]; then
  echo "install.sh: $wheels has no packed.json or requirements-host.txt; pack it again with tools/tpu/pack.py" >&2
  exit 1
fi
packed_for="$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["python"])' "$wheels/packed.json")"
have="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$packed_for" != "$have" ]; then
  echo "install.sh: the wheels were packed for Python $packed_for, but $python is $have; pack again with --python $have" >&2
  exit 1
fi
mkdir -p "$site"
# A tmpfs such as a TPU VM's /dev/shm may be mounted noexec: everything installs, and
# then the first compiled module (tensorstore's, at the first checkpoint) fails to load
# with "failed to map segment from shared object".
if "$python" -c 'import os, sys; sys.exit(not os.statvfs(sys.argv[1]).f_flag & os.ST_NOEXEC)' "$site"; then
  echo "install.sh: $site is on a filesystem mounted noexec, where compiled modules cannot be loaded; give another SITE (bash tools/tpu/install.sh $wheels /tmp/theseus-site)" >&2
  exit 1
fi
if ! "$python" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 2))' 2>/dev/null; then
  echo "install.sh: $python's pip is missing or older than 22.2 (this needs pip install --dry-run --report)" >&2
  exit 1
fi
host_jax="$("$python" -c 'import jax; print(jax.__file__)' 2>/dev/null)" || {
  echo "install.sh: $python cannot import jax; this installs beside the host's own JAX (check PYTHONPATH)" >&2
  exit 1
}

packed="$site/packed/site-packages"
host="$site/host/site-packages"
rm -rf "$site/packed" "$site/host"
echo "1/3 the packed wheels -> $packed"
"$python" -m pip install --quiet --disable-pip-version-check --no-deps --no-index \
  --target "$packed" "$wheels"/*.whl
echo "2/3 requirements-host.txt from $index -> $host"
# Resolved within the index, installed less what the host has (its JAX, numpy, ...) and
# what step 1 installed, so no second JAX lands on PYTHONPATH.
index_pip=(env PIP_CONFIG_FILE=/dev/null "$python" -m pip install --quiet --isolated
  --disable-pip-version-check --only-binary=:all: --index-url "$index")
"${index_pip[@]}" --dry-run --ignore-installed --report "$site/resolved.json" \
  -r "$wheels/requirements-host.txt" || {
  echo "install.sh: the host's index ($index) lacks what pip names above; pack again with" \
    "--index-has listing only what it gives (pack.py packs the rest)" >&2
  exit 1
}
"$python" - "$site/resolved.json" "$wheels/packed.json" "$site/host.txt" <<'EOF'
import json
import re
import sys

resolved, packed, out = sys.argv[1:]
record = json.load(open(packed))


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


skip = {norm(n) for n in record["host"]} | {norm(w.split("-")[0]) for w in record["wheels"]}
chosen = [
    (norm(item["metadata"]["name"]), item["metadata"]["version"])
    for item in json.load(open(resolved))["install"]
]
with open(out, "w") as lines:
    lines.writelines(f"{name}=={version}\n" for name, version in chosen if name not in skip)
EOF
"${index_pip[@]}" --no-deps --target "$host" -r "$site/host.txt"

export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$packed:$host"
echo "3/3 checking JAX and Theseus"
HOST_JAX="$host_jax" SITE="$site" "$python" - <<'EOF'
import os
import sys

import jax

if jax.__file__ != os.environ["HOST_JAX"]:
    sys.exit(f"install.sh: jax now imports from {jax.__file__}, not the host's "
             f"{os.environ['HOST_JAX']}; put the host's folder first in PYTHONPATH")
import theseus.analysis
import theseus.model

for module in (theseus.model, theseus.analysis):
    where = list(module.__path__)[0]
    if not where.startswith(os.environ["SITE"]):
        sys.exit(f"install.sh: {module.__name__} imports from {where}, not {os.environ['SITE']}")
devices = jax.devices()
kinds = sorted({d.platform for d in devices})
line = f"JAX {jax.__version__} (the host's) sees {len(devices)} device(s): {devices[0].device_kind}"
if "tpu" not in kinds:
    if os.environ.get("THESEUS_ACCELERATOR_ALLOW_CPU") != "1":
        sys.exit(f"install.sh: {line}, and no TPU (JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r})")
    line += " (no TPU: THESEUS_ACCELERATOR_ALLOW_CPU=1)"
print(line)
EOF
echo
echo "Installed. In each shell that runs Theseus here:"
echo "  export PYTHONPATH=\"\${PYTHONPATH:+\$PYTHONPATH:}$packed:$host\""
echo "  export PATH=\"$packed/bin:\$PATH\""
echo "  export THESEUS_TPU_SITE=\"$site\""
echo "then, from $repo: python3 -m nox -s tpu (the demo, the accelerator set, the suite),"
echo "or the accelerator set alone: python3 -m pytest --accelerator"
