#!/usr/bin/env python3
"""bench/sweep_table.py on hand-made sweep JSON: the figures it derives, and its refusals; and
docs/performance.md's sweep table against the script's output for the JSON it names.

Run by CTest (tests/CMakeLists.txt); standard library only.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPT = os.path.join(ROOT, "bench", "sweep_table.py")


def row(**changes):
    """One sweep row: 10 µs moving 40 MB (4000 GB/s) and 5e8 FLOPs (50 TFLOP/s), roofline 8 µs."""
    r = {"cache": "fp8", "layout": "latent", "B": 32, "L": 4096, "H": 128, "split_us": 10.0, "wgmma": True,
         "mma_us": 25.0, "seed_us": 2000.0, "roofline_us": 8.0, "bytes": 4e7, "flops": 5e8, "torch_us": 30.0}
    r.update(changes)
    return r


class SweepTable(unittest.TestCase):
    def run_script(self, document, raw=None):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "sweep.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(raw if raw is not None else json.dumps(document))
            done = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr

    def cells(self, document):
        code, out, err = self.run_script(document)
        self.assertEqual(code, 0, err)
        lines = [line for line in out.splitlines() if line.startswith("| fp8") or line.startswith("| nvfp4")]
        return out, [[c.strip() for c in line.strip("|").split("|")] for line in lines]

    def test_figures(self):
        out, rows = self.cells({"copy_gbps": 4000.0, "matmul_tflops": 750.0, "sweep": [row()]})
        self.assertIn("Copy 4000.0 GB/s, BF16 matmul 750 TFLOP/s", out)
        self.assertEqual(rows, [["fp8", "latent", "32", "4096", "128", "10.0", "50.0", "4000", "8.0", "80.0%",
                                 "2000.0", "200.0", "30.0", "3.00", "25.0", "2.50"]])

    def test_absent_times_are_dashes(self):
        _, rows = self.cells({"copy_gbps": 4000.0, "matmul_tflops": 750.0,
                              "sweep": [row(seed_us=None, torch_us=None), row(wgmma=False, mma_us=10.0)]})
        self.assertEqual(rows[0][10:14], ["—", "—", "—", "—"])
        # No wgmma entry ran: the split time bench once wrote as mma_us is not an mma.sync time.
        self.assertEqual(rows[1][14:16], ["—", "—"])

    def test_timing_is_said(self):
        out, _ = self.cells({"copy_gbps": 4000.0, "timing": "flush", "sweep": [row()]})
        self.assertIn("Timing: flush (each run queued behind a 256 MiB memset", out)
        out, _ = self.cells({"copy_gbps": 4000.0, "timing": "blocking", "sweep": [row()]})
        self.assertIn("Timing: blocking (each run's stream held while its launches queue", out)
        out, _ = self.cells({"copy_gbps": 4000.0, "sweep": [row()]})  # before the setting: lone
        self.assertIn("Timing: lone (each run's start event on an idle stream", out)

    def test_without_torch_no_roofline_fraction(self):
        out, rows = self.cells({"copy_gbps": 4000.0, "sweep": [row()]})
        self.assertIn("no matmul rate", out)
        self.assertEqual(rows[0][8:10], ["8.0", "—"])

    def test_refusals_name_the_field(self):
        cases = [
            ({"copy_gbps": 4000.0, "sweep": [row(split_us=0)]}, "row 0: 'split_us' is 0, not a positive number"),
            ({"copy_gbps": 4000.0, "sweep": [row(), row(split_us=None)]}, "row 1: 'split_us' is null"),
            ({"copy_gbps": 4000.0, "sweep": [row(split_us="7")]}, "row 0: 'split_us' is \"7\""),
            ({"copy_gbps": 4000.0, "sweep": [{k: v for k, v in row().items() if k != "bytes"}]},
             "row 0: 'bytes' is null"),
            ({"copy_gbps": 4000.0}, "no 'sweep' rows"),
            ([row()], "the top level is a JSON list"),
            ({"copy_gbps": 4000.0, "matmul_tflops": None, "sweep": {}}, "'sweep' is a JSON dict"),
            ({"copy_gbps": 4000.0, "matmul_tflops": -1, "sweep": [row()]}, "'matmul_tflops' is -1"),
            ({"sweep": [row()]}, "'copy_gbps' is null"),
            ({"copy_gbps": 4000.0, "sweep": [row(layout="a|b")]}, "row 0: 'layout' is \"a|b\", not one of"),
            ({"copy_gbps": 4000.0, "sweep": [row(H=1.5)]}, "row 0: 'H' is 1.5, not a positive integer"),
            ({"copy_gbps": 4000.0, "sweep": [row(wgmma="yes")]}, "row 0: 'wgmma' is \"yes\""),
            ({"copy_gbps": 4000.0, "sweep": [row(torch_us=float("inf"))]}, "row 0: 'torch_us' is Infinity"),
            ({"copy_gbps": 4000.0, "timing": "warm", "sweep": [row()]}, "'timing' is 'warm', not 'blocking', 'flush' or 'lone'"),
        ]
        for document, message in cases:
            with self.subTest(message=message):
                code, out, err = self.run_script(document)
                self.assertEqual(code, 2)
                self.assertEqual(out, "")
                self.assertIn(message, err)

    def test_not_json_or_missing(self):
        code, _, err = self.run_script(None, raw='{"copy_gbps": 4000.0, "sweep": [')
        self.assertEqual(code, 2)
        self.assertIn("not JSON", err)
        done = subprocess.run([sys.executable, SCRIPT, "/nonexistent/sweep.json"], capture_output=True, text=True,
                              check=False)
        self.assertEqual(done.returncode, 2)
        self.assertIn("/nonexistent/sweep.json: No such file or directory", done.stderr)


class DocumentedSweep(unittest.TestCase):
    def test_the_docs_table_is_the_named_runs(self):
        """"The sweep" in docs/performance.md names its JSON (`python3 bench/sweep_table.py FILE`);
        its rows are the script's rows for that file, every one of them."""
        with open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("\n## The sweep"):]
        section = section[:section.index("\n## ", 1)]
        named = re.search(r"`python3 bench/sweep_table\.py (bench/results/[^`\s]+\.json)`", section)
        self.assertIsNotNone(named, "no `python3 bench/sweep_table.py bench/results/FILE.json` in The sweep")
        done = subprocess.run([sys.executable, SCRIPT, os.path.join(ROOT, named.group(1))], capture_output=True,
                              text=True, check=True)

        def rows(md):
            return [line for line in md.splitlines() if line.startswith("| fp8 ") or line.startswith("| nvfp4 ")]

        want = rows(done.stdout)
        self.assertEqual(len(want), 192)
        self.assertEqual(rows(section), want)


if __name__ == "__main__":
    unittest.main()
