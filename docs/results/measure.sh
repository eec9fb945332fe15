#!/usr/bin/env bash
# docs/results/measure.sh: the run whose JSON and plots are committed in
# docs/results, and the docs rendered from it (run on the GPU machine from
# the repository root): `pinmem bench all` writes one report and one plot
# per test, the C reference beside it where cref/build can build it, and
# docs/PERF.md, the README's figure table and claims are rendered from the
# JSON.
# Re-render on any machine with: docs/results/measure.sh --render
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=docs/results
# The command: $PINMEM if set, else the one scripts/gpu-suite build put in
# .gpu/bin (a GPU machine needs no Go), else built here with its revision.
bin=${PINMEM:-}
# The image pipeline example's measurement, found or built the same way.
imagepipeline=${PINMEM_IMAGEPIPELINE:-}
if [[ -z "$bin" ]]; then
	bin=$(mktemp -d)/pinmem
	if [[ -e .gpu/bin/pinmem.gz ]]; then
		gunzip -c .gpu/bin/pinmem.gz >"$bin" && chmod +x "$bin"
	elif [[ -x .gpu/bin/pinmem ]]; then
		cp .gpu/bin/pinmem "$bin"
	else
		if [[ -z "$imagepipeline" ]]; then
			imagepipeline=$(dirname "$bin")/imagepipeline
			go build -o "$imagepipeline" ./examples/imagepipeline/measure
		fi
		rev=$(git rev-parse HEAD)
		modified=false
		git diff --quiet HEAD || modified=true
		go build -buildvcs=true -ldflags="-X main.stampedRevision=$rev -X main.stampedModified=$modified" -o "$bin" ./cmd/pinmem
	fi
fi
# reports: every result file here (not the schemas, not doctor's report).
reports() {
	local f
	for f in "$out"/*.json; do
		case "$f" in *.schema.json | */doctor.json) ;; *) echo "$f" ;; esac
	done
}
# render: docs/PERF.md, the README's figure table and its claims from the
# result files.
render() {
	mapfile -t files < <(reports)
	"$bin" report --format markdown "${files[@]}" -o docs/PERF.md
	"$bin" report --into README.md "${files[@]}"
}
if [[ "${1:-}" == "--render" ]]; then
	render
	exit 0
fi
args=()
if cref/build -o "$(dirname "$bin")/cref" >/dev/null 2>&1; then
	args+=(--cref "$(dirname "$bin")/cref")
fi
[[ -n "${PINMEM_WEIGHTS:-}" ]] && args+=(--weights "$PINMEM_WEIGHTS")
[[ -z "$imagepipeline" && -x .gpu/bin/imagepipeline ]] && imagepipeline=.gpu/bin/imagepipeline
[[ -n "$imagepipeline" ]] && args+=(--imagepipeline "$imagepipeline")
"$bin" version
# The directory holds one run: the previous run's files go (git keeps them).
mapfile -t old < <(reports)
rm -f "${old[@]}" "${old[@]/%.json/.png}" "$out/doctor.txt" "$out/imagepipeline.txt"
"$bin" doctor --format json -o "$out/doctor.json"
"$bin" bench all --out "$out" "${args[@]}"
render
