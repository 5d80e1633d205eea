#!/usr/bin/env bash
# Runs here, on the CPU machine: downloads Debian's libdw1 and libelf1 (amd64, the GPU machine's
# processor) into .nsys-debs/ (ignored by git), which the device tool carries to the GPU machine.
# There nsys 2025.3.1's importer needs libdw.so.1, which the image lacks (issue 45); without it nsys
# writes only a .qdstrm. tools/gpu_nsys.sh unpacks them. Prints the folder to pass as `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.nsys-debs
pkgs=(libdw1 libelf1)
fail() { echo "nsys_fetch: $*" >&2; exit 1; }
command -v apt-get >/dev/null || fail "apt-get not found: this needs a Debian machine; put ${pkgs[*]} (amd64 .deb) into $dir/ by hand"
mkdir -p "$dir"
rm -f "$dir"/*.deb
opts=()
if [[ "$(dpkg --print-architecture)" != amd64 ]]; then  # another processor here: amd64's lists on the side
  mkdir -p /tmp/nsys-amd64/partial
  opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/nsys-amd64)
  apt-get "${opts[@]}" update >&2 || fail "apt-get update (amd64 lists) failed: no network to Debian's mirror?"
fi
download() { (cd "$dir" && apt-get "${opts[@]}" download "${pkgs[@]}") >&2; }
if ! download; then
  echo "nsys_fetch: download failed; refreshing the package lists once" >&2
  apt-get "${opts[@]}" update >&2 || fail "apt-get update failed: no network to Debian's mirror?"
  download || fail "apt-get download ${pkgs[*]} failed (see above)"
fi
for p in "${pkgs[@]}"; do
  compgen -G "$dir/${p}_*_amd64.deb" >/dev/null || fail "$dir/ has no ${p}_*_amd64.deb after the download"
done
ls -l "$dir" >&2
echo "$dir"
