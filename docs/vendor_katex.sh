#!/usr/bin/env bash
# Vendors KaTeX, the docs site's math renderer, from npm's `katex` package at a pinned version into
# docs/assets/katex/ (the files unchanged, with the package's licence), so the site renders math offline.
#   bash docs/vendor_katex.sh            # the pinned version below
set -euo pipefail
VERSION=0.19.1
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "katex@$VERSION" >/dev/null && tar xzf "katex-$VERSION.tgz")
target=assets/katex
rm -rf "$target"
mkdir -p "$target/contrib"
cp "$work/package/LICENSE" "$target/LICENSE"
cp "$work/package/dist/katex.min.js" "$work/package/dist/katex.min.css" "$target/"
cp "$work/package/dist/contrib/auto-render.min.js" "$target/contrib/"
cp -r "$work/package/dist/fonts" "$target/fonts"
echo "katex $VERSION (npm), from its dist/ folder; refresh with docs/vendor_katex.sh" > "$target/VERSION.txt"
