#!/usr/bin/env bash
# Enforces the package graph of docs/design.md: imports point downwards only.
#   cmd/sbxfs -> manager -> {fuse, commit, layers, fsutil}
#   fuse -> layers, fsutil (the only importer of go-fuse)
#   commit -> layers, fsutil;  layers -> fsutil;  fsutil -> stdlib, x/sys
# Nothing imports manager or cmd. Tools that are not part of sbxfs (tests/,
# scripts/: the benchmark's fuse-loopback reference) may use go-fuse too.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
allowed() { # package -> allowed internal imports (space separated)
  case "$1" in
    cmd/sbxfs)   echo "manager fuse commit layers fsutil" ;;
    manager)     echo "fuse commit layers fsutil" ;;
    fuse)        echo "layers fsutil" ;;
    commit)      echo "layers fsutil" ;;
    layers)      echo "fsutil" ;;
    fsutil)      echo "" ;;
    tests*)      echo "ANY" ;;
    *)           echo "ANY" ;;
  esac
}
fail=0
while read -r pkg imports; do
  rel=${pkg#"$mod"/}
  allow=$(allowed "$rel")
  for imp in $imports; do
    case "$imp" in
      "$mod"/*)
        irel=${imp#"$mod"/}
        [ "$allow" = "ANY" ] && continue
        top=${irel%%/*}
        [ "$irel" = "cmd/sbxfs" ] && top=cmd/sbxfs
        if ! [[ " $allow " == *" $top "* ]]; then
          echo "forbidden import: $rel -> $irel"; fail=1
        fi ;;
      github.com/hanwen/go-fuse/*)
        if [ "$rel" != fuse ] && [[ "$rel" != tests* ]] && [[ "$rel" != fuse/* ]] && [[ "$rel" != scripts/* ]]; then
          echo "forbidden import: $rel -> $imp (only fuse/ imports go-fuse)"; fail=1
        fi ;;
    esac
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./...)
exit $fail
