// What the benchmarks read of a process from /proc.
import { readdirSync, readFileSync } from "node:fs";

/**
 * A process's CPU time so far (user + system), in microseconds. Unlike
 * req/s, CPU per request hardly moves when the load generator or a
 * neighbour competes for the cores: the figure to compare across runs here.
 */
export function cpuMicros(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) * (1_000_000 / 100); // utime, stime in clock ticks (USER_HZ 100)
}

/** A process's resident memory now (VmRSS) or at its peak so far (VmHWM), in MiB. */
export function memoryMb(pid: number, field: "VmRSS" | "VmHWM"): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) / 1024 : Number.NaN;
}

/**
 * The CPU time so far (µs) of every process on this machine named `name`
 * (PostgreSQL's backends, its WAL writer and the rest), or undefined when
 * there is none: a store on another machine is not measured.
 */
export function cpuMicrosOfAll(name: string): number | undefined {
  let total: number | undefined;
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/comm`, "utf8").trim() !== name) continue;
      total = (total ?? 0) + cpuMicros(Number(pid));
    } catch {
      // gone meanwhile
    }
  }
  return total;
}
