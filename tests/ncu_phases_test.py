#!/usr/bin/env python3
"""bench/ncu_phases.py on a hand-made ncu SASS page: the three parts' shares and reasons, and its refusals.

Run by CTest (tests/CMakeLists.txt); standard library only.
"""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "ncu_phases.py")
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"stall_barrier","stall_long_sb","stall_barrier (Not Issued)"')


def page(lines):
    # ncu's page opens with the kernel's name, then the header, then a row an instruction
    return "\n".join(['"Kernel Name","k",', HEADER] + lines) + "\n"


class NcuPhases(unittest.TestCase):
    def run_script(self, text, *extra):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "k_sass.csv")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return subprocess.run([sys.executable, SCRIPT, path, *extra], capture_output=True, text=True, check=False)

    def test_parts(self):
        # 0x10 once a warp (prologue: 10 samples, all long_sb); 0x20-0x30 the loop (60 samples);
        # 0x40 once (epilogue: 30 samples, 20 of them at a barrier)
        done = self.run_script(page([
            '"0x10","LDG","10","900","0","10","0"',
            '"0x20","HMMA","40","9000","0","0","0"',
            '"0x30","BRA","20","9000","0","0","0"',
            '"0x40","BAR","30","900","20","10","0"',
        ]))
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertTrue(lines[0].startswith("before the loop   10.0% of the samples, 1 instructions; long_sb 100%"))
        self.assertTrue(lines[1].startswith("in the loop       60.0% of the samples, 2 instructions"))
        self.assertTrue(lines[2].startswith("after the loop    30.0% of the samples, 1 instructions; barrier 67%, "
                                            "long_sb 33%"))
        # with a threshold above every count, no loop
        refused = self.run_script(page(['"0x10","LDG","10","900","0","10","0"']), "--loop-min", "1000")
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("no instruction executed more than 1000 times", refused.stderr)

    def test_not_a_sass_page(self):
        done = self.run_script('"File Name","x.cu"\n"Line No","Source"\n"1","int x;"\n')
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("has no Address and Instructions Executed columns", done.stderr)


if __name__ == "__main__":
    unittest.main()
