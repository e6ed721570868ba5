/**
 * The nemesis: process-level faults on a seeded schedule, during the fault phase. Network faults run continuously
 * in the proxies (rates drawn from the seed) and crash points fire inside the processes; this loop adds what
 * needs the driver: pausing a server past its lease (the fencing case), killing database connections and
 * restarting Postgres.
 */
import type { FaultKind } from './faults.js'
import type { Random } from './random.js'

export interface NemesisActions {
  /** SIGSTOP a server for `ms`, moving its traffic to another instance meanwhile, then SIGCONT it. */
  pauseServer(ms: number): Promise<void>
  /** Terminate the API's database connections. */
  killDbConnections(): Promise<void>
  /** Stop Postgres and start it again (only when the driver owns it). */
  restartDb(): Promise<void>
}

export interface NemesisOptions {
  random: Random
  faults: readonly FaultKind[]
  actions: NemesisActions
  /** How long a pause lasts: longer than the server's lease, so another instance takes the keys over. */
  pauseMs: number
  /** Mean wait between two faults. @default 4000 */
  meanIntervalMs?: number
  /** A fault that could not be injected (the database was down, say); the schedule goes on. @default ignore */
  onError?: (error: unknown) => void
}

/** Starts the schedule; `stop()` ends it and waits for the fault in progress to finish (a paused server resumes). */
export function startNemesis(options: NemesisOptions): { stop(): Promise<void> } {
  const kinds = options.faults.filter(
    (f) => f === 'pause-server' || f === 'kill-db-connections' || f === 'restart-db',
  )
  const mean = options.meanIntervalMs ?? 4000
  let stopped = kinds.length === 0
  let wake: (() => void) | undefined
  const loop = (async () => {
    // Each kind once early, so a short run still shows every kind; then seeded picks.
    const queue = [...kinds]
    while (!stopped) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, options.random.int(mean / 2, (mean * 3) / 2))
        wake = () => {
          clearTimeout(timer)
          resolve()
        }
      })
      if (stopped) break
      const kind = queue.shift() ?? options.random.pick(kinds)
      try {
        if (kind === 'pause-server') await options.actions.pauseServer(options.pauseMs)
        else if (kind === 'restart-db') await options.actions.restartDb()
        else await options.actions.killDbConnections()
      } catch (error) {
        options.onError?.(error)
      }
    }
  })()
  return {
    async stop() {
      stopped = true
      wake?.()
      await loop
    },
  }
}
