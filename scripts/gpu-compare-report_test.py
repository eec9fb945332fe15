#!/usr/bin/env python3
"""Tests of gpu-compare-report.py on logs written here in the formats the
test binaries print (input fixtures, not measurements), and of the table of
scripts/gpu-compare. Run: python3 scripts/gpu-compare-report_test.py"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "gpu-compare-report.py")


def bench(name, **metrics):
    pairs = "\t".join(f"{v} {k.replace('__', '/').replace('_', '-')}" for k, v in metrics.items())
    return f"{name}-16   \t       1\t1000 ns/op\t{pairs}\n"


IMG = """=== RUN   TestOnGPU
    main_test.go:133: 
        imagepipeline: 3x3 box blur of RGBA frames on NVIDIA H200, 240 frames a run through a ring of 8, 4 streams, median of 3 runs
        4k (3840x2160, 31.6 MiB a frame): pinned copies both ways at once run at {bidir} GB/s: at most {bound} FPS
          Go frames staged both ways at once by two Copiers run at 20.0 GB/s: at most 600 FPS from Go memory
          mode                                               FPS  speed-up  % of bound
          naive: Go frames, synchronous, one at a time     {naive}     1.00x       10.0%
          pinned frames, 4 streams                        {pinned}     5.00x       50.0%
        C baseline (imagepipeline, same kernel.ptx, same loops, this run):
          4k     naive: C 100.0 FPS, Go {naive} FPS: Go/C {goc}
          4k     both directions at once: C 50.0 GB/s
--- PASS: TestOnGPU (30.00s)
PASS
"""


class ReportTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        self.run_dir = os.path.join(self.dir, "run")
        os.makedirs(os.path.join(self.run_dir, "logs"))
        table = subprocess.run([os.path.join(HERE, "gpu-compare"), "list"], check=True, capture_output=True, text=True).stdout
        self.write("table", table)
        self.write("meta.json", json.dumps({"old": "aaa", "new": "bbb", "dry_run": False, "gpu": "fixture", "host": "h",
                                            "date": "d", "runs": 2}))
        self.write("missing.tsv", "copy-vs-c\told\tno test or benchmark matching ^BenchmarkCopyVsC$\n")
        self.index = []

    def write(self, rel, text):
        with open(os.path.join(self.run_dir, rel), "w") as f:
            f.write(text)

    def log(self, rnd, entry, side, text, rc=0):
        rel = f"logs/{entry}.{side}.r{rnd}.log"
        self.write(rel, text)
        self.index.append(f"{rnd}\t{entry}\t{side}\t{rc}\t3\t{rel}\n")

    def report(self):
        self.write("index.tsv", "".join(self.index))
        js, md = os.path.join(self.dir, "c.json"), os.path.join(self.dir, "c.md")
        p = subprocess.run([sys.executable, REPORT, "--json", js, "--md", md, self.run_dir], capture_output=True, text=True)
        with open(js) as f, open(md) as g:
            return p.returncode, json.load(f), g.read()

    def row(self, out, entry, row, metric):
        for c in out["compared"]:
            if (c["entry"], c["row"], c["metric"]) == (entry, row, metric):
                return c
        self.fail(f"no compared row {entry} {row} {metric}: {out['compared']}")

    def test_ratios_verdicts_and_checks(self):
        name = "BenchmarkCopierVsDriver/H2D/4KiB"
        # Two rounds; copier-GB/s: old 10, 10.2, new 10.4, 9.9; staged-GB/s 9 against 10 with an in-run
        # spread of 20% in old (within spread); copier-ctx-GB/s 9 against 10 with none (slower).
        for rnd, (o, n) in enumerate([(10, 10.4), (10.2, 9.9)], 1):
            self.log(rnd, "copier-vs-driver", "old", bench(name, copier_GB__s=o, staged_GB__s=10, staged_min_GB__s=9,
                                                           staged_max_GB__s=11, copier_ctx_GB__s=10,
                                                           copier__driver_paired=1.05))
            self.log(rnd, "copier-vs-driver", "new", bench(name, copier_GB__s=n, staged_GB__s=9, copier_ctx_GB__s=9,
                                                           copier__driver_paired=0.97) + bench(name.replace("4KiB", "8KiB"), copier_GB__s=1))
            self.log(rnd, "pipeline-vs-c", "old", bench("BenchmarkPipelineVsC", go_ms__run=10, go__c=1.0))
            self.log(rnd, "pipeline-vs-c", "new", bench("BenchmarkPipelineVsC", go_ms__run=8, go__c=0.8))
        rc, out, md = self.report()
        self.assertEqual(rc, 1, "a slower row must fail the report")
        c = self.row(out, "copier-vs-driver", name, "copier-GB/s")
        self.assertAlmostEqual(c["speed_new_over_old"], 10.15 / 10.1)
        self.assertEqual((c["paired_min"], c["paired_max"]), (9.9 / 10.2, 10.4 / 10))
        self.assertEqual(c["verdict"], "ok")
        self.assertEqual(self.row(out, "copier-vs-driver", name, "staged-GB/s")["verdict"], "within spread")
        self.assertEqual(self.row(out, "copier-vs-driver", name, "copier-ctx-GB/s")["verdict"], "SLOWER")
        p = self.row(out, "pipeline-vs-c", "BenchmarkPipelineVsC", "go-ms/run")
        self.assertAlmostEqual(p["speed_new_over_old"], 10 / 8, msg="lower-is-better metrics compare old/new")
        checks = {(c["row"], c["metric"]): c["ok"] for c in out["checks"]}
        self.assertFalse(checks[(name, "copier/driver-paired")])
        self.assertTrue(checks[("BenchmarkPipelineVsC", "go/c")])
        self.assertIn({"entry": "copier-vs-driver", "row": name.replace("4KiB", "8KiB"), "metric": "copier-GB/s", "side": "new"},
                      out["only_in_one"])
        self.assertEqual(out["missing"][0]["entry"], "copy-vs-c")
        self.assertIn("| copier-vs-driver | BenchmarkCopierVsDriver/H2D/4KiB | copier-ctx-GB/s | 10 | 9 | 0.9 |", md)

    def test_imagepipeline_and_tests(self):
        self.log(1, "imagepipeline-4k", "old", IMG.format(bidir=50.0, bound=800, naive=100.0, pinned=400.0, goc=1.00))
        self.log(1, "imagepipeline-4k", "new", IMG.format(bidir=50.0, bound=800, naive=110.0, pinned=400.0, goc=1.10))
        self.log(1, "huge-buffers", "old", "--- PASS: TestGPUHugeBuffers (40.00s)\n    --- PASS: TestGPUHugeBuffers/Alloc (20.00s)\n")
        self.log(1, "huge-buffers", "new", "--- FAIL: TestGPUHugeBuffers (40.00s)\n    --- FAIL: TestGPUHugeBuffers/Alloc (10.00s)\nFAIL\n", rc=1)
        rc, out, md = self.report()
        self.assertAlmostEqual(self.row(out, "imagepipeline-4k", "4k/naive: Go frames, synchronous, one at a time", "FPS")["speed_new_over_old"], 1.1)
        self.assertAlmostEqual(self.row(out, "imagepipeline-4k", "4k/pinned frames, 4 streams", "FPS")["speed_new_over_old"], 1.0)
        self.assertAlmostEqual(self.row(out, "imagepipeline-4k", "4k/naive vs C", "go/c")["new_median"], 1.1)
        self.assertAlmostEqual(self.row(out, "imagepipeline-4k", "4k/bound", "FPS")["old_median"], 800)
        failed = [r for r in out["runs"] if r["rc"] != 0]
        self.assertEqual([(r["entry"], r["side"], r["failed"]) for r in failed],
                         [("huge-buffers", "new", ["TestGPUHugeBuffers", "TestGPUHugeBuffers/Alloc"])])
        self.assertIn("TestGPUHugeBuffers/Alloc", [o["row"] for o in out["only_in_one"]])
        self.assertIn("## Failed runs", md)
        self.assertEqual(rc, 1, "a failed run fails the report")

    def test_dry_run_is_labelled(self):
        self.write("meta.json", json.dumps({"old": "a", "new": "b", "dry_run": True}))
        self.write("missing.tsv", "")
        self.log(1, "copier-vs-driver", "old", "--- SKIP: BenchmarkCopierVsDriver\n")
        rc, out, md = self.report()
        self.assertEqual(rc, 0, "nothing slower, failed or missing")
        self.assertTrue(out["dry_run"])
        self.assertIn("DRY RUN", md.splitlines()[2])
        self.assertEqual(out["runs"][0]["skipped"], ["BenchmarkCopierVsDriver"])  # a benchmark's SKIP line has no duration


if __name__ == "__main__":
    unittest.main()
