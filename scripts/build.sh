#!/usr/bin/env bash
# Builds the sbxfs binary as it is installed, benchmarked and demonstrated:
#
#   scripts/build.sh OUT [VERSION]
#
# Statically linked (CGO_ENABLED=0: sbxfs needs no C library; Go's own
# resolver and user lookups serve the few places that could use one) and
# without urfave/cli's Markdown and man page generators (build tag
# urfave_cli_no_docs; sbxfs never generates its docs at run time). Every
# sbxfs process, and `sbxfs mount` starts two, then starts faster: 26 ->
# 21 ms for `sbxfs --version` on the VM it was measured on, most of it
# page faults of the binary and package initialisation (docs/design.md,
# "Start-up"). A plain `go build ./cmd/sbxfs` makes a binary that works
# the same, only starts slower. Environment: GO (the go command).
set -euo pipefail
out=${1:?usage: scripts/build.sh OUT [VERSION]}
version=${2:-dev}
go=${GO:-}
if [[ -z $go ]]; then
	if command -v go >/dev/null 2>&1; then
		go=go
	elif [[ -x /usr/local/go/bin/go ]]; then
		go=/usr/local/go/bin/go
	else
		echo "build: go not found: install Go or set GO=/path/to/go" >&2
		exit 1
	fi
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CGO_ENABLED=0 "$go" build -tags urfave_cli_no_docs -ldflags "-X main.version=$version" -o "$out" ./cmd/sbxfs
