/**
 * The liveness monitor: `GET /healthz` on every instance, straight to it (not through its fault proxy), one probe at
 * a time per instance, from the first instance's start until the ledger is read. A probe waits as long as it takes,
 * so a hung instance shows how long it hung; each is recorded when it ends (see `HealthEvent`), and the liveness
 * rules judge it against its bound.
 */
import { setTimeout as sleep } from 'node:timers/promises'
import type { NewEvent } from './history.js'

export interface MonitoredInstance {
  name: string
  /** The current incarnation, while it runs. */
  pid: number | undefined
  port: number | undefined
}

export interface HealthMonitorOptions {
  instances: () => readonly MonitoredInstance[]
  record: (event: NewEvent) => void
  boundMs: number
  /** Pause between two probes of one instance. @default 1000 */
  intervalMs?: number
}

/** Starts probing; `stop()` records the probes still waiting as unanswered and resolves once all loops ended. */
export function startHealthMonitor(options: HealthMonitorOptions): { stop(): Promise<void> } {
  const interval = options.intervalMs ?? 1000
  const stopping = new AbortController()
  const loops = new Map<string, Promise<void>>()

  const probe = async (name: string) => {
    while (!stopping.signal.aborted) {
      const instance = options.instances().find((each) => each.name === name)
      if (instance?.port !== undefined) {
        const sentAt = Date.now()
        const base = { process: 'liveness', target: name, sentAt, boundMs: options.boundMs }
        const pid = instance.pid === undefined ? {} : { pid: instance.pid }
        try {
          const res = await fetch(`http://127.0.0.1:${instance.port}/healthz`, { signal: stopping.signal })
          await res.arrayBuffer()
          options.record({
            type: 'health',
            phase: 'ok',
            ...base,
            ...pid,
            receivedAt: Date.now(),
            status: res.status,
          })
        } catch (error) {
          if (stopping.signal.aborted) {
            options.record({
              type: 'health',
              phase: 'info',
              ...base,
              ...pid,
              error: 'still waiting when the run ended',
            })
            return
          }
          const cause = String((error as Error).cause ?? error)
          options.record({
            type: 'health',
            phase: 'info',
            ...base,
            ...pid,
            receivedAt: Date.now(),
            error: cause,
          })
        }
      }
      await sleep(interval, undefined, { signal: stopping.signal }).catch(() => {})
    }
  }
  // New instances are picked up as they appear; each has one loop.
  const watch = setInterval(() => {
    for (const { name } of options.instances()) if (!loops.has(name)) loops.set(name, probe(name))
  }, 200)
  return {
    async stop() {
      clearInterval(watch)
      stopping.abort()
      await Promise.all(loops.values())
    },
  }
}
