"""Checks memscope-bpf's memory snapshot against the framework's own (probe-user/tests/snapshot.rs).

    python snapshot_check.py compare OURS THEIRS SCRIPT
        the same segments (address, total_size), the same blocks in each (address, size, state),
        the same alloc/free actions in the same order (action, address), and, for each action,
        the same lines of SCRIPT in the Python frames (innermost first); exit 1 with the
        differences otherwise
    python snapshot_check.py render OURS OUTDIR
        torch's own torch/cuda/_memory_viz.py draws OURS: trace_plot and segment_plot (HTML
        pages), memory, segments and compare (flame graph input; the flame graph itself needs
        flamegraph.pl from the network, so the folded text is kept), segsum and trace (text)

Only the torch wheel of the interpreter running it is used.
"""

import os
import pickle
import sys

ACTIONS = ("segment_alloc", "alloc", "free_requested", "free_completed", "segment_free")


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def script_lines(frames, script):
    return [(f["line"], f["name"]) for f in frames if f["filename"] == script]


def segments(snap):
    return sorted(
        (s["device"], s["address"], s["total_size"],
         tuple((b["address"], b["size"], b["state"]) for b in s["blocks"]))
        for s in snap["segments"]
    )


def actions(snap, script):
    out = []
    for device, trace in enumerate(snap["device_traces"]):
        for e in trace:
            if e["action"] in ACTIONS:
                out.append((device, e["action"], e["addr"], tuple(script_lines(e["frames"], script))))
    return out


def compare(ours_path, theirs_path, script):
    ours, theirs = load(ours_path), load(theirs_path)
    bad = []
    if segments(ours) != segments(theirs):
        bad.append(f"segments differ:\n  ours   {segments(ours)}\n  theirs {segments(theirs)}")
    a, b = actions(ours, script), actions(theirs, script)
    if [x[:3] for x in a] != [x[:3] for x in b]:
        width = max(len(a), len(b))
        pad = lambda xs: [x[:3] for x in xs] + [None] * (width - len(xs))  # noqa: E731
        bad.append("actions differ (device, action, address):\n" + "\n".join(
            f"  {'  ' if x == y else '! '}ours {x}  theirs {y}" for x, y in zip(pad(a), pad(b))))
    else:
        for x, y in zip(a, b):
            if x[3] != y[3]:
                bad.append(f"{x[1]} 0x{x[2]:x}: Python frames in {script}: ours {x[3]}, theirs {y[3]}")
    # The live blocks' own frames too.
    theirs_frames = {b["address"]: script_lines(b["frames"], script)
                     for s in theirs["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    for s in ours["segments"]:
        for blk in s["blocks"]:
            if blk["state"] == "active_allocated" and theirs_frames.get(blk["address"]) != script_lines(blk["frames"], script):
                bad.append(f"block 0x{blk['address']:x}: ours {script_lines(blk['frames'], script)}, theirs {theirs_frames.get(blk['address'])}")
    n_blocks = sum(len(s["blocks"]) for s in ours["segments"])
    n_live = sum(b["state"] == "active_allocated" for s in ours["segments"] for b in s["blocks"])
    print(f"segments {len(ours['segments'])}, blocks {n_blocks} ({n_live} live), actions {len(a)}; "
          f"their actions {len(b)}; with script frames {sum(bool(x[3]) for x in a)}")
    if bad:
        print("\n".join(bad))
        sys.exit(1)


def render(ours_path, outdir):
    from torch.cuda import _memory_viz as mv
    snap = load(ours_path)
    folded = lambda text: text  # noqa: E731  (flamegraph.pl would be downloaded)
    outputs = {
        "trace_plot.html": mv.trace_plot(snap),
        "segment_plot.html": mv.segment_plot(snap),
        "memory.folded": mv.memory(snap, format_flamegraph=folded),
        "segments.folded": mv.segments(snap, format_flamegraph=folded),
        "compare.folded": mv.compare(snap["segments"], [], format_flamegraph=folded),
        "segsum.txt": mv.segsum(snap),
        "trace.txt": mv.trace(snap),
    }
    os.makedirs(outdir, exist_ok=True)
    for name, text in outputs.items():
        if not text:
            print(f"{name}: empty")
            sys.exit(1)
        with open(os.path.join(outdir, name), "w") as f:
            f.write(text)
    print(" ".join(f"{k}={len(v)}" for k, v in outputs.items()))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "render":
        render(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {cmd}")
