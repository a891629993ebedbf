"""Benchmark: 64 stages, 2 virtual stages, 512 micro-batches, interleaved 1F1B (131,072 compute ops
and 129,024 transfers). Target (issue 13): under 2 s per simulation on a 2-core machine, since the
planner's sweeps call the engine thousands of times. Prints the median of 3 runs of (build the
schedule + program) and (simulate), and the same for the bubble encoder policy.

    python benchmarks/bench_pipeline.py
"""

from __future__ import annotations

import statistics
import time


def main() -> None:
    from k3sim.pipeline import EncoderWork, build_schedule, place, simulate, text_program, uniform_costs

    p, v, m = 64, 2, 512
    costs = uniform_costs(p, v, 1.0, 2.0, send_s=0.01)
    build, sim, total, cpu = [], [], [], []
    for _ in range(3):
        c0 = time.process_time()
        t0 = time.perf_counter()
        prog = text_program(build_schedule("interleaved-1f1b", p, m, v), costs).program
        t1 = time.perf_counter()
        tl = simulate(prog)
        t2 = time.perf_counter()
        cpu.append(time.process_time() - c0)
        build.append(t1 - t0)
        sim.append(t2 - t1)
        total.append(t2 - t0)
    ideal = m * 3.0
    print(f"interleaved-1f1b p={p} v={v} m={m}: {prog.num_ops} ops, step {tl.step_time_s:.1f} s "
          f"(bubble {(tl.step_time_s - max(tl.busy_s())) / ideal:.4f}, formula {(p - 1) / (v * m):.4f})")
    print(f"  build median {statistics.median(build):.3f} s, simulate median {statistics.median(sim):.3f} s, "
          f"total median {statistics.median(total):.3f} s  (runs: {', '.join(f'{x:.3f}' for x in total)}); "
          f"CPU time median {statistics.median(cpu):.3f} s (wall minus time lost to other processes)")
    print("  (transfers cost 0.01 s per hop here, so the bubble is a little above the free-transfer formula)")
    enc = EncoderWork.uniform(m, 0.3)
    sched = build_schedule("interleaved-1f1b", p, m, v)
    bub = []
    for _ in range(3):
        t0 = time.perf_counter()
        tl = simulate(place(sched, costs, enc, "bubble").program)
        bub.append(time.perf_counter() - t0)
    print(f"  bubble encoder policy (plan = one probe run + placement + run): median "
          f"{statistics.median(bub):.3f} s, step {tl.step_time_s:.1f} s")


if __name__ == "__main__":
    main()
