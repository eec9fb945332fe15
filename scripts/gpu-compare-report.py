#!/usr/bin/env python3
"""gpu-compare-report: the new/old table of scripts/gpu-compare's runs.

    gpu-compare-report.py --json FILE --md FILE RUNDIR...

Each RUNDIR is what one `.gpu/compare/run` wrote (unpacked from its
compare-logs.tar.gz): meta.json, table, index.tsv and the logs it names.
Several RUNDIRs (calls of one or more leases, of the same two builds) are
merged: every (run, round) in which both binaries ran gives one paired ratio.

For each benchmark of the table it reads the rows the logs print (Go
benchmark lines, `--- PASS` lines of tests, the image pipeline's table), and
for each key metric of the table it reports the medians of old and new, the
speed ratio new/old (above 1: the new code is faster; a metric marked "-" is
lower-is-better and its ratio is old/new), the paired ratios' min and max, and
a verdict: "ok" at 0.98 or above, "within spread" when the shortfall is inside
the old binary's own spread (its samples' range over the rounds, or the row's
in-run min/max metrics), else "SLOWER". Rows printed by one binary only, and
benchmarks missing from either, are listed, never dropped. The table's checks
("metric>=value") are evaluated on the new binary's medians. The exit
status is 1 when a row is SLOWER, a check fails, a run fails or a benchmark
is missing. Standard library
only: it runs under the GPU machine's python3.
"""

import argparse
import fnmatch
import json
import os
import re
import statistics
import sys

SCHEMA = "pinmem-gpu-compare/1"

BENCH_LINE = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.+)$")
TEST_LINE = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+)(?: \(([\d.]+)s\))?")
IMG_RES = re.compile(
    r"^\s*(\S+) \((\d+)x(\d+), [\d.]+ MiB a frame\): pinned copies both ways at once run at ([\d.]+) GB/s: at most ([\d.]+) FPS")
IMG_STAGED = re.compile(r"^\s*Go frames staged both ways at once by two Copiers run at ([\d.]+) GB/s: at most ([\d.]+) FPS")
IMG_MODE = re.compile(r"^\s*(\S.*?)\s{2,}([\d.]+)\s+([\d.]+)x\s+([\d.]+)%")
IMG_C = re.compile(r"^\s*(\S+)\s+(naive|pinned, \d+ streams): C ([\d.]+) FPS, Go ([\d.]+) FPS: Go/C ([\d.]+)")
IMG_CBIDIR = re.compile(r"^\s*(\S+)\s+both directions at once: C ([\d.]+) GB/s")


def read_table(path):
    """Entries of the benchmark table (see scripts/gpu-compare's table)."""
    entries = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = [x.strip() for x in line.split("|")]
            if len(fields) != 8:
                raise SystemExit(f"table line has {len(fields)} fields, want 8: {line}")
            name, pkgs, listre, env, args, fmt, est, rest = fields
            metrics_s, _, checks_s = rest.partition(";")
            metrics = []
            for m in metrics_s.split():
                pat, _, d = m.rpartition(":")
                if d not in "+-" or not pat:
                    raise SystemExit(f"{name}: metric {m!r}: want PATTERN:+ or PATTERN:-")
                metrics.append((pat, d))
            checks = []
            for c in checks_s.split():
                mm = re.match(r"^(.+?)(>=|<=)([\d.]+)$", c)
                if not mm:
                    raise SystemExit(f"{name}: check {c!r}: want METRIC>=VALUE or METRIC<=VALUE")
                checks.append((mm.group(1), mm.group(2), float(mm.group(3))))
            entries.append({"name": name, "format": fmt, "metrics": metrics, "checks": checks})
    return entries


def parse_log(text, fmt):
    """Rows {row: {metric: value}} and test statuses {name: status} of one log."""
    rows, status = {}, {}
    res = None
    for line in text.splitlines():
        m = TEST_LINE.match(line)
        if m:
            status[m.group(2)] = m.group(1)
            if fmt == "test" and m.group(1) == "PASS" and m.group(3):
                rows.setdefault(m.group(2), {})["s"] = float(m.group(3))
            continue
        if fmt == "bench":
            m = BENCH_LINE.match(line.strip())
            if m:
                toks = m.group(3).split()
                vals = rows.setdefault(m.group(1), {})
                for i in range(0, len(toks) - 1, 2):
                    try:
                        vals[toks[i + 1]] = float(toks[i])
                    except ValueError:
                        pass
            continue
        if fmt == "imagepipeline":
            m = IMG_RES.match(line)
            if m:
                res = m.group(1)
                rows[res + "/bound"] = {"bidir-GB/s": float(m.group(4)), "FPS": float(m.group(5))}
                continue
            m = IMG_STAGED.match(line)
            if m and res:
                rows[res + "/staged bound"] = {"staged-GB/s": float(m.group(1)), "FPS": float(m.group(2))}
                continue
            m = IMG_C.match(line)
            if m:
                rows[f"{m.group(1)}/{m.group(2)} vs C"] = {
                    "c-FPS": float(m.group(3)), "go-FPS": float(m.group(4)), "go/c": float(m.group(5))}
                continue
            m = IMG_CBIDIR.match(line)
            if m:
                rows[m.group(1) + "/C both ways"] = {"c-GB/s": float(m.group(2))}
                continue
            m = IMG_MODE.match(line)
            if m and res and m.group(1) != "mode":
                rows[f"{res}/{m.group(1)}"] = {"FPS": float(m.group(2))}
    return rows, status


def key_direction(entry, metric):
    for pat, d in entry["metrics"]:
        if fnmatch.fnmatchcase(metric, pat):
            return d
    return None


def in_run_spread(vals, metric):
    """Relative in-run spread of metric from companions NAME-min-UNIT and
    NAME-max-UNIT (as sideBySideRounds reports copier-min-GB/s), else 0."""
    base, sep, unit = metric.rpartition("-")
    if not sep:
        return 0.0
    lo, hi, med = vals.get(f"{base}-min-{unit}"), vals.get(f"{base}-max-{unit}"), vals.get(metric)
    if lo is None or hi is None or not med:
        return 0.0
    return (hi - lo) / med


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("rundirs", nargs="+")
    a = ap.parse_args()

    metas, entries = [], None
    samples = {}   # (entry, row, metric) -> side -> [(run, round, value)]
    spreads = {}   # (entry, row, metric) -> side -> [in-run relative spread]
    runs, missing = [], []
    for k, d in enumerate(a.rundirs):
        with open(os.path.join(d, "meta.json")) as f:
            meta = json.load(f)
        metas.append(meta)
        table = read_table(os.path.join(d, "table"))
        if entries is None:
            entries = table
        if os.path.exists(os.path.join(d, "missing.tsv")):
            with open(os.path.join(d, "missing.tsv")) as f:
                for line in f:
                    e, side, why = line.rstrip("\n").split("\t")
                    if {"entry": e, "side": side, "why": why} not in missing:
                        missing.append({"entry": e, "side": side, "why": why})
        byname = {e["name"]: e for e in table}
        with open(os.path.join(d, "index.tsv")) as f:
            for line in f:
                rnd, ename, side, rc, secs, log = line.rstrip("\n").split("\t")
                entry = byname[ename]
                with open(os.path.join(d, log), errors="replace") as lf:
                    text = lf.read()
                rows, status = parse_log(text, entry["format"])
                failed = sorted(n for n, s in status.items() if s == "FAIL")
                skipped = sorted(n for n, s in status.items() if s == "SKIP")
                run = {"run": k, "round": int(rnd), "entry": ename, "side": side, "rc": int(rc),
                       "seconds": float(secs), "log": os.path.join(os.path.basename(os.path.normpath(d)), log),
                       "rows": len(rows), "failed": failed, "skipped": skipped}
                if int(rc) != 0:
                    run["tail"] = text.splitlines()[-6:]
                runs.append(run)
                for row, vals in rows.items():
                    for metric, v in vals.items():
                        key = (ename, row, metric)
                        samples.setdefault(key, {}).setdefault(side, []).append((k, int(rnd), v))
                        spreads.setdefault(key, {}).setdefault(side, []).append(in_run_spread(vals, metric))
    byname = {e["name"]: e for e in entries}

    compared, only = [], []
    for (ename, row, metric), sides in sorted(samples.items()):
        d = key_direction(byname[ename], metric)
        if d is None:
            continue
        old, new = sides.get("old", []), sides.get("new", [])
        if not old or not new:
            only.append({"entry": ename, "row": row, "metric": metric, "side": "old" if old else "new"})
            continue
        mo = statistics.median(v for _, _, v in old)
        mn = statistics.median(v for _, _, v in new)

        def speed(n, o):
            if d == "+":
                return n / o if o else None
            return o / n if n else None
        ratio = speed(mn, mo)
        oldv = {(r, rnd): v for r, rnd, v in old}
        paired = [speed(v, oldv[(r, rnd)]) for r, rnd, v in new if (r, rnd) in oldv]
        paired = [p for p in paired if p is not None]
        ov = [v for _, _, v in old]
        spread = max([(max(ov) - min(ov)) / mo if mo else 0.0] + spreads[(ename, row, metric)].get("old", [0.0]))
        if ratio is None:
            verdict = "no ratio (zero)"
        elif ratio >= 0.98:
            verdict = "ok"
        elif ratio >= 1 - spread:
            verdict = "within spread"
        else:
            verdict = "SLOWER"
        compared.append({"entry": ename, "row": row, "metric": metric, "better": "higher" if d == "+" else "lower",
                         "old": [v for _, _, v in old], "new": [v for _, _, v in new],
                         "old_median": mo, "new_median": mn, "speed_new_over_old": ratio,
                         "paired": paired, "paired_min": min(paired) if paired else None,
                         "paired_max": max(paired) if paired else None, "old_spread": spread, "verdict": verdict})

    checks = []
    for e in entries:
        for pat, op, want in e["checks"]:
            for (ename, row, metric), sides in sorted(samples.items()):
                if ename != e["name"] or not fnmatch.fnmatchcase(metric, pat) or "new" not in sides:
                    continue
                v = statistics.median(x for _, _, x in sides["new"])
                checks.append({"entry": ename, "row": row, "metric": metric, "check": f"{op}{want:g}", "new_median": v,
                               "ok": v >= want if op == ">=" else v <= want})

    dry = any(m.get("dry_run") for m in metas)
    out = {"schema": SCHEMA,
           "label": "DRY RUN without a GPU: plumbing check, not a result" if dry else "GPU run",
           "dry_run": dry, "calls": metas, "runs": runs, "missing": missing,
           "compared": compared, "only_in_one": only, "checks": checks}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    with open(a.md, "w") as f:
        f.write(render(out))
    bad = ([c for c in compared if c["verdict"] == "SLOWER"] + [c for c in checks if not c["ok"]] + missing +
           [r for r in runs if r["rc"] != 0 or r["failed"]])
    print(f"gpu-compare report: {len(compared)} rows compared, {sum(c['verdict'] == 'SLOWER' for c in compared)} slower, "
          f"{sum(not c['ok'] for c in checks)} of {len(checks)} checks failed, {len(missing)} missing, "
          f"{len(only)} rows in one binary only, {sum(r['rc'] != 0 for r in runs)} runs failed", file=sys.stderr)
    return 1 if bad else 0


def fmt(v, digits=3):
    if v is None:
        return "-"
    return f"{v:.{digits}g}"


def render(out):
    w = []
    m0 = out["calls"][0] if out["calls"] else {}
    w.append("# pinmem: old against new, interleaved\n")
    if out["dry_run"]:
        w.append("**DRY RUN without a GPU: this checks the script's plumbing; no figure here is a measurement.**\n")
    w.append(f"old {m0.get('old', '?')}, new {m0.get('new', '?')}; "
             f"{len(out['calls'])} call(s): " + "; ".join(
                 f"{m.get('date', '?')} on {m.get('gpu', '?')} ({m.get('host', '?')}), {m.get('runs', '?')} run(s), C references {m.get('cref', '?')}"
                 for m in out["calls"]) + "\n")
    w.append("Speed new/old: above 1 the new code is faster (for a lower-is-better metric, old/new). "
             "Paired: the ratio within each round, min-max. Verdict: ok at 0.98 or above; within spread when "
             "the shortfall is inside the old binary's own spread.\n")
    if out["missing"]:
        w.append("## Missing\n")
        for m in out["missing"]:
            w.append(f"- {m['entry']} ({m['side']}): {m['why']}")
        w.append("")
    failed = [r for r in out["runs"] if r["rc"] != 0 or r["failed"]]
    if failed:
        w.append("## Failed runs\n")
        for r in failed:
            w.append(f"- {r['entry']} {r['side']} round {r['round']}: exit {r['rc']}, failed {', '.join(r['failed']) or '-'} ({r['log']})")
            for t in r.get("tail", []):
                w.append(f"    {t}")
        w.append("")
    w.append("## Speed\n")
    w.append("| benchmark | row | metric | old | new | new/old | paired min-max | old spread | verdict |")
    w.append("|---|---|---|---:|---:|---:|---:|---:|---|")
    for c in out["compared"]:
        w.append(f"| {c['entry']} | {c['row']} | {c['metric']} | {fmt(c['old_median'], 4)} | {fmt(c['new_median'], 4)} | "
                 f"{fmt(c['speed_new_over_old'])} | {fmt(c['paired_min'])}-{fmt(c['paired_max'])} | "
                 f"{100 * c['old_spread']:.1f}% | {c['verdict']} |")
    w.append("")
    if out["checks"]:
        w.append("## Checks on the new binary\n")
        w.append("| benchmark | row | metric | new | want | ok |")
        w.append("|---|---|---|---:|---|---|")
        for c in out["checks"]:
            w.append(f"| {c['entry']} | {c['row']} | {c['metric']} | {fmt(c['new_median'], 4)} | {c['check']} | {'yes' if c['ok'] else 'NO'} |")
        w.append("")
    if out["only_in_one"]:
        w.append("## Rows printed by one binary only\n")
        for o in out["only_in_one"]:
            w.append(f"- {o['entry']} {o['row']} {o['metric']}: {o['side']} only")
        w.append("")
    w.append("## Runs\n")
    w.append("| benchmark | side | round | exit | seconds | rows | skipped |")
    w.append("|---|---|---:|---:|---:|---:|---|")
    for r in out["runs"]:
        w.append(f"| {r['entry']} | {r['side']} | {r['round']} | {r['rc']} | {r['seconds']:.1f} | {r['rows']} | {', '.join(r['skipped']) or '-'} |")
    return "\n".join(w) + "\n"


if __name__ == "__main__":
    sys.exit(main())
