#!/usr/bin/env bash
# Installs the Debian packages memfit needs, only those missing.
#   install_deps.sh build   compiler, CMake, OpenBLAS (OpenMP), oneDNN, libyaml, cJSON, PCRE2, xxHash, Open MPI, npm
#   install_deps.sh test    the above plus PyTorch (the reference), jsonschema (JSON output schemas), Node.js and
#                           xmllint (report tests), clang-14 with its libFuzzer runtime (the fuzz smoke test)
set -euo pipefail
what=${1:-build}
pkgs=(build-essential cmake pkg-config libopenblas0-openmp libopenblas-openmp-dev libdnnl-dev libyaml-dev
      libcjson-dev libpcre2-dev libxxhash-dev openmpi-bin libopenmpi-dev ca-certificates)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
if [ "$what" = test ]; then
  pkgs+=(python3-torch python3-numpy python3-jsonschema libxml2-utils clang-14 libclang-rt-14-dev libtcmalloc-minimal4)
  command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install_deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
