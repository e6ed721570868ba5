// Readers of Linux /proc for the suites that split CPU between processes (cpu, instances): they read what the
// kernel already counts, so measuring costs nothing in the measured processes.
import { readdirSync, readFileSync } from 'node:fs'

const CLOCK_TICKS_PER_SECOND = 100 // USER_HZ: 100 on every Linux architecture Node runs on

/**
 * CPU seconds `pid` has used so far, every thread of it; 0 when it has ended. From the scheduler's own count
 * (`schedstat`, nanoseconds) summed over the process's threads, else from user + system time in clock ticks (10 ms
 * each: a 500-request run of a few hundred microseconds each spans only a few ticks per process, so those readings
 * are coarse). `/proc/<pid>/schedstat` alone counts the main thread only, and a Node process does part of its work
 * on others (the garbage collector's parallel and concurrent marking, the optimizing compiler): read alone, it
 * credited the variants that allocate most with the least CPU.
 */
export function cpuSeconds(pid: number): number {
  try {
    let nanoseconds = 0
    for (const thread of readdirSync(`/proc/${pid}/task`)) {
      try {
        nanoseconds += Number(readFileSync(`/proc/${pid}/task/${thread}/schedstat`, 'utf8').split(' ')[0])
      } catch {
        // the thread ended between the listing and the read: its time is lost, as it is for threads ended earlier
      }
    }
    if (nanoseconds > 0) return nanoseconds / 1e9
  } catch {
    // no such process, or no schedstat: the tick counts
  }
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_SECOND
  } catch {
    return 0 // the process ended meanwhile
  }
}

/** Write system calls `pid` has made so far. */
export function writeCalls(pid: number): number {
  try {
    return Number(/syscw: (\d+)/.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))?.[1] ?? 0)
  } catch {
    return 0
  }
}

/** CPU seconds used so far by each process named `postgres` (backends, WAL writer, checkpointer, autovacuum). */
export function postgresProcesses(): Map<number, number> {
  const seconds = new Map<number, number>()
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      if (readFileSync(`/proc/${entry}/comm`, 'utf8').trim() === 'postgres')
        seconds.set(Number(entry), cpuSeconds(Number(entry)))
    } catch {
      // gone
    }
  }
  return seconds
}

/** CPU seconds used so far by every process named `postgres`, summed. */
export function postgresSeconds(): number {
  let total = 0
  for (const seconds of postgresProcesses().values()) total += seconds
  return total
}

/**
 * CPU seconds processes used between two readings by pid: one that started in between counts from 0, one that ended
 * in between is left out (a plain difference of sums would go negative when a busy backend exits).
 */
export const cpuDelta = (before: Map<number, number>, after: Map<number, number>) =>
  [...after].reduce((sum, [pid, seconds]) => sum + Math.max(0, seconds - (before.get(pid) ?? 0)), 0)

/** True when this machine can be measured this way (Linux /proc, Postgres processes visible). */
export function postgresVisible(): boolean {
  try {
    return postgresSeconds() > 0
  } catch {
    return false
  }
}

/** The whole machine's CPU time so far, in clock ticks summed over all cores: busy, and waiting for the disk. */
export interface MachineTicks {
  busy: number
  iowait: number
  total: number
}

export function machineTicks(): MachineTicks {
  // First line of /proc/stat: cpu user nice system idle iowait irq softirq steal ...
  const fields = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number)
  const total = fields.slice(0, 8).reduce((sum, n) => sum + n, 0)
  const idle = fields[3]!
  const iowait = fields[4]!
  return { busy: total - idle - iowait, iowait, total }
}
