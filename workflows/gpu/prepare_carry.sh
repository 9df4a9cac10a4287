#!/usr/bin/env bash
# Copy what the GPU run needs from the assets folder into .carry/assets (ignored by git), the folder named in
# the device tool's `carry`: ../shared/assets does not travel with the repository.
#   stories260K/hf/                  the real stories260K model (Hugging Face folder, ~2 MB)
#   long_text/tinystories_sample.txt the TinyStories sample the capture reads (~4 KB)
# The assets folder is $KVSIM_ASSETS, else ../shared/assets beside the repository (as traces/assets.py).
# run_all points KVSIM_ASSETS at .carry/assets by itself when that folder exists.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
src="${KVSIM_ASSETS:-$root/../shared/assets}"
dest="$root/.carry/assets"
need=(stories260K/hf/config.json stories260K/hf/model.safetensors stories260K/hf/tokenizer.json
      long_text/tinystories_sample.txt)
for f in "${need[@]}"; do
  if [ ! -f "$src/$f" ]; then
    echo "error: $src/$f not found (set KVSIM_ASSETS to the assets folder)" >&2
    exit 2
  fi
done
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/stories260K" "$dest.tmp/long_text"
cp -r "$src/stories260K/hf" "$dest.tmp/stories260K/hf"
cp "$src/long_text/tinystories_sample.txt" "$dest.tmp/long_text/"
[ -f "$src/README.md" ] && cp "$src/README.md" "$dest.tmp/README.md"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "copied into $dest ($(du -sh "$dest" | cut -f1)); carry: [\".carry\"]"
