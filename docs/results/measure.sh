#!/usr/bin/env bash
# docs/results/measure.sh: the full measurement whose JSON and plots are
# committed in docs/results (run on the GPU machine from the repository
# root). Each command writes its report atomically as JSON and its plot as
# PNG; the wall time of the whole run is printed at the end. Re-render the
# plots from the JSON on any machine with:
#   for f in docs/results/*.json; do pinmem report "$f" --format png -o "${f%.json}.png"; done
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=docs/results
# The command: $PINMEM if set, else the one scripts/gpu-suite build put in
# .gpu/bin (a GPU machine needs no Go), else built here.
bin=${PINMEM:-}
if [[ -z "$bin" ]]; then
	bin=$(mktemp -d)/pinmem
	if [[ -e .gpu/bin/pinmem.gz ]]; then
		gunzip -c .gpu/bin/pinmem.gz >"$bin" && chmod +x "$bin"
	elif [[ -x .gpu/bin/pinmem ]]; then
		cp .gpu/bin/pinmem "$bin"
	else
		go build -o "$bin" ./cmd/pinmem
	fi
fi
"$bin" version
"$bin" doctor -o "$out/doctor.txt"
start=$(date +%s)
"$bin" bench --format json -o "$out/bench.json" --plot "$out/bench.png"
"$bin" bench pin --format json -o "$out/pin.json" --plot "$out/pin.png"
"$bin" bench overlap --format json -o "$out/overlap.json" --plot "$out/overlap.png"
"$bin" zerocopy --format json -o "$out/zerocopy.json" --plot "$out/zerocopy.png"
"$bin" bench matrix --format json -o "$out/matrix.json" --plot "$out/matrix.png"
echo "full run: $(( $(date +%s) - start )) s wall"
for f in bench pin overlap zerocopy matrix; do "$bin" report "$out/$f.json"; done
