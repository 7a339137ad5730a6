#!/usr/bin/env python3
"""Side by side, interleaved: what the default Python line (--call-stack's default, python:16)
costs the traced thread of a dispatch-bound loop on the real torch + torch_npu wheels (the
simulated CANN), against no stacks (--call-stack=), the full walk (--call-stack=python, 50
frames) and untraced. Per iteration: one torch.empty, one x + x, two frees. The loop thread's
own CPU time (time.thread_time) per iteration is the figure: on a loaded machine it is what
the tracer adds to the thread, not what the neighbours take. Medians of the rounds.

    python3 tests/torch-stacks-ab.py TRACER VENV CANN_DIR [ROUNDS] [ITERATIONS]
"""
import os
import statistics
import subprocess
import sys
import tempfile

LOOP = r'''
import os, sys, time, torch, torch_npu
torch.npu.set_device(0)
x = torch.ones(256, device="npu")
def step():
    a = torch.empty(1024, device="npu")
    b = x + x
    del a, b
n = int(sys.argv[1])
for _ in range(200):
    step()
c0, w0 = time.thread_time(), time.perf_counter()
for _ in range(n):
    step()
c1, w1 = time.thread_time(), time.perf_counter()
print(f"cpu_us={(c1 - c0) / n * 1e6:.3f} wall_us={(w1 - w0) / n * 1e6:.3f}", flush=True)
'''

def main():
    tracer, venv, cann = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    n = int(sys.argv[5]) if len(sys.argv) > 5 else 3000
    env = dict(os.environ, ASCEND_HOME_PATH=cann, ASCEND_OPP_PATH=f"{cann}/opp",
               LD_LIBRARY_PATH=f"{cann}/lib64")
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "loop.py")
        with open(script, "w") as f:
            f.write(LOOP)
        py = [os.path.join(venv, "bin/python"), script, str(n)]
        configs = {
            "untraced": py,
            "no stacks (--call-stack=)": [tracer, "-q", "-o", d, "--call-stack=", "--"] + py,
            "default (python:16)": [tracer, "-q", "-o", d, "--"] + py,
            "full walk (--call-stack=python)": [tracer, "-q", "-o", d, "--call-stack=python", "--"] + py,
        }
        got = {k: [] for k in configs}
        for r in range(rounds):
            for name, cmd in configs.items():
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                line = [l for l in out.stdout.splitlines() if l.startswith("cpu_us=")]
                if out.returncode != 0 or not line:
                    sys.exit(f"{name}: failed: {out.stderr[-2000:]}")
                f = dict(kv.split("=") for kv in line[0].split())
                got[name].append((float(f["cpu_us"]), float(f["wall_us"])))
                print(f"round {r + 1} {name}: {line[0]}", file=sys.stderr, flush=True)
        base = statistics.median(c for c, _ in got["untraced"])
        print(f"| configuration | thread CPU µs/iteration (median of {rounds}) | × untraced | wall µs/iteration |")
        print("|---|---|---|---|")
        for name, v in got.items():
            cpu = statistics.median(c for c, _ in v)
            wall = statistics.median(w for _, w in v)
            print(f"| {name} | {cpu:.2f} | {cpu / base:.2f} | {wall:.2f} |")

if __name__ == "__main__":
    main()
