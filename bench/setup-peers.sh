#!/usr/bin/env bash
# The routers llmgw is measured against, each in a virtualenv of its own under bench/.peers/:
#
#   bench/.peers/litellm       litellm[proxy]==1.108.7    (the `litellm` proxy CLI)
#   bench/.peers/vllm-router   vllm-router from PyPI      (the Rust router, `vllm-router`)
#
#     bench/setup-peers.sh [PYTHON]
#
# PYTHON (default: python3) builds the virtualenvs.  Run it again at will: a peer
# whose virtualenv already holds the wanted version is left alone.  bench/router.py
# measures whichever peers are installed here and skips, saying so, the others.
# Exits 1 naming the peer that could not be installed, after removing its half-made
# virtualenv so that bench/router.py does not use it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
peers="$here/.peers"
python=${1:-python3}
LITELLM_VERSION=1.108.7

command -v "$python" >/dev/null || { echo "setup-peers: no $python to build virtualenvs with; pass another as the first argument" >&2; exit 1; }
mkdir -p "$peers"

# installed VENV DIST: the version of DIST in VENV, or nothing
installed() {
    [ -x "$1/bin/python" ] || return 0
    "$1/bin/python" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "$2" 2>/dev/null || true
}

# peer NAME DIST WANTED SPEC COMMAND: make bench/.peers/NAME hold SPEC, whose DIST must be
# at version WANTED (any, if empty) and provide bin/COMMAND.
peer() {
    local name=$1 dist=$2 wanted=$3 spec=$4 command=$5 venv="$peers/$1" have
    have=$(installed "$venv" "$dist")
    if [ -n "$have" ] && { [ -z "$wanted" ] || [ "$have" = "$wanted" ]; } && [ -x "$venv/bin/$command" ]; then
        echo "setup-peers: $name: $dist $have already installed in $venv"
        return 0
    fi
    echo "setup-peers: $name: installing $spec into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    if ! "$venv/bin/python" -m pip install --quiet "$spec"; then
        rm -rf "$venv"
        echo "setup-peers: $name: pip could not install $spec (its output is above); removed $venv" >&2
        return 1
    fi
    if [ ! -x "$venv/bin/$command" ]; then
        rm -rf "$venv"
        echo "setup-peers: $name: $spec installed but gave no $command command; removed $venv" >&2
        return 1
    fi
    echo "setup-peers: $name: installed $dist $(installed "$venv" "$dist") in $venv"
}

status=0
peer litellm litellm "$LITELLM_VERSION" "litellm[proxy]==$LITELLM_VERSION" litellm || status=1
peer vllm-router vllm-router "" vllm-router vllm-router || status=1

echo "setup-peers: installed:"
for name in litellm vllm-router; do
    v=$(installed "$peers/$name" "$name")
    echo "  $name: ${v:-NOT INSTALLED} ($peers/$name)"
done
exit $status
