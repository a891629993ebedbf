"""Measure the host link of one GPU: pinned and pageable host <-> device copies through PyTorch (copy engine),
timed with CUDA events, at the sizes a prefix-cache restore moves (one KV page of K3 at TP8 is ~166 MB; a whole
prompt's hit up to a few GB). Writes JSON (median of `REPS` timed copies after warm-up per size and direction)
with the machine's provenance; reports/prefix_cache/offload.md reads the pinned figures as the achieved fraction
of the datasheet's PCIe Gen5 x16 peak.

Run on the GPU machine: python3 reports/prefix_cache/host_link/measure_host_link.py OUT.json
"""

import json
import platform
import statistics
import subprocess
import sys
import time

import torch

SIZES = [2 ** 20 * m for m in (16, 64, 256, 1024, 4096)]  # bytes
REPS = 10


def timed(copy, reps=REPS):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        copy()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start.record()
        copy()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def main(path):
    dev = torch.device("cuda")
    rows = []
    for n in SIZES:
        g = torch.empty(n, dtype=torch.uint8, device=dev)
        for pinned in (True, False):
            h = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
            h.fill_(1)
            for direction, copy in (("h2d", lambda: g.copy_(h, non_blocking=pinned)),
                                    ("d2h", lambda: h.copy_(g, non_blocking=pinned))):
                ts = timed(copy)
                med = statistics.median(ts)
                rows.append({"bytes": n, "pinned": pinned, "direction": direction, "seconds_median": med,
                             "seconds_min": min(ts), "seconds_max": max(ts), "reps": len(ts),
                             "bytes_per_s_median": n / med})
            del h
        del g
    # both directions at once (an eviction's write-back beside a restore), 1 GiB each, pinned, two streams
    n = 2 ** 30
    g1, g2 = torch.empty(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
    h1, h2 = torch.empty(n, dtype=torch.uint8, pin_memory=True), torch.empty(n, dtype=torch.uint8, pin_memory=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    ts = []
    for i in range(REPS + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(s1):
            g1.copy_(h1, non_blocking=True)
        with torch.cuda.stream(s2):
            h2.copy_(g2, non_blocking=True)
        torch.cuda.synchronize()
        if i >= 3:
            ts.append(time.perf_counter() - t0)
    bidir = {"bytes_each_direction": n, "seconds_median": statistics.median(ts),
             "bytes_per_s_each_direction_median": n / statistics.median(ts), "timer": "host wall clock"}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,pcie.link.gen.current,pcie.link.gen.max,"
                          "pcie.link.width.current,pcie.link.width.max,driver_version", "--format=csv"],
                         capture_output=True, text=True).stdout
    prov = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "hostname": platform.node(), "kernel": platform.release(), "date": time.strftime("%Y-%m-%d"),
            "nvidia_smi": smi.strip(), "command": " ".join(sys.argv), "timer": "CUDA events around one copy_"}
    json.dump({"provenance": prov, "copies": rows, "bidirectional": bidir}, open(path, "w"), indent=1)
    for r in rows:
        print(r["bytes"], "pinned" if r["pinned"] else "pageable", r["direction"],
              f"{r['bytes_per_s_median'] / 1e9:.2f} GB/s")
    print("bidirectional", f"{bidir['bytes_per_s_each_direction_median'] / 1e9:.2f} GB/s each")
    print(smi)


if __name__ == "__main__":
    main(sys.argv[1])
