#!/usr/bin/env python3
"""Side by side: the node agent's CPU per traced call for agent binaries given as arguments,
default (sampled stacks) and counters only (`--stack-depth 0`), interleaved rounds (the order
of the binaries alternating), medians at the end.

Each run: a fresh agent (`--lib` the fixture HAL and mstx), a 1 s warm-up loop (the agent loads
the loop binary's debug information once), then `bench_loop --mode hal --seconds SECS --work 8`;
agent CPU = utime + stime of its process over that loop. "foreign": events the agent received
beyond the loop's calls (other processes on the machine; a few negative when the loop's last
calls were still in the reorder window). Needs root and the fixtures (make -C tests/fixtures).
Another agent on the machine spoils the figures: check `ps -eo args | grep "[a]gent --listen"`.

    tests/agent-cpu-ab.py ROUNDS SECS NAME=AGENT_BINARY ...
e.g. tests/agent-cpu-ab.py 7 8 before=/tmp/memscope-bpf.base after=target/release/memscope-bpf
"""
import os, re, signal, socket, subprocess, sys, time, statistics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = REPO + "/tests/fixtures/build"
TCK = os.sysconf("SC_CLK_TCK")


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TCK


def get(addr, path):
    try:
        s = socket.create_connection(addr, timeout=10)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
        return int(head.split(" ")[1]), body
    except OSError:
        return None, ""


def events(addr):
    _, body = get(addr, "/metrics")
    m = re.search(r"^memscope_agent_events_total (\S+)", body, re.M)
    return float(m.group(1)) if m else float("nan")


def loop(secs):
    out = subprocess.run([FIX + "/bin/bench_loop", "--mode", "hal", "--seconds", str(secs), "--work", "8"],
                         capture_output=True, text=True).stdout
    calls = float(re.search(r"calls[=:]\s*(\d+)", out).group(1))
    return calls


def one(binary, extra):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    addr = ("127.0.0.1", port)
    args = [binary, "agent", "--listen", f"127.0.0.1:{port}", "--log-level", "warn",
            "--lib", FIX + "/lib/libascend_hal.so", "--lib", FIX + "/lib/libms_tools_ext.so"] + extra
    p = subprocess.Popen(args, env=dict(os.environ, MEMSCOPE_BPF_DETACH="foreground"),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    t0 = time.time()
    while get(addr, "/ready")[0] != 200:
        if time.time() - t0 > 120:
            p.kill(); raise SystemExit("never ready")
        time.sleep(0.1)
    loop(1)
    e0, c0 = events(addr), cpu(p.pid)
    calls = loop(SECS)
    c1, e1 = cpu(p.pid), events(addr)
    p.send_signal(signal.SIGTERM); p.wait()
    c = c1 - c0
    return 1e6 * c / calls, 1e6 * c / (e1 - e0), calls, e1 - e0 - calls


ROUNDS = int(sys.argv[1]); SECS = int(sys.argv[2])
bins = [a.split("=", 1) for a in sys.argv[3:]]
modes = [("default", []), ("counters", ["--stack-depth", "0"])]
res = {}
for r in range(ROUNDS):
    for mode, extra in modes:
        order = bins if r % 2 == 0 else bins[::-1]
        for name, b in order:
            load = open("/proc/loadavg").read().split()[0]
            pc, pe, calls, foreign = one(b, extra)
            res.setdefault((name, mode), []).append((pc, pe, foreign))
            print(f"round {r} {name:8} {mode:8} {pc:.3f} us/call {pe:.3f} us/event "
                  f"calls {calls:.0f} foreign {foreign:.0f} load {load}", flush=True)
print("medians:")
for (name, mode), v in sorted(res.items(), key=lambda x: (x[0][1], x[0][0])):
    pcs = [x[0] for x in v]; pes = [x[1] for x in v]
    print(f"{mode:8} {name:8} per call {' '.join(f'{x:.2f}' for x in pcs)} median {statistics.median(pcs):.3f}"
          f" | per event median {statistics.median(pes):.3f}")
