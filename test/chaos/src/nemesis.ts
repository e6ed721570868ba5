/**
 * The nemesis: process-level faults on a seeded schedule, during the fault phase. Network faults run continuously
 * in the proxies (rates drawn from the seed) and crash points fire inside the processes; this loop adds what
 * needs the driver: pausing a server past its lease (the fencing case), killing database connections, restarting
 * Postgres, failing it over to its standby, restarting a Citus worker or killing its connections, restarting PgBouncer, and saturating an instance's connection pool with failing and slow
 * attempts (the liveness case).
 */
import type { FaultKind } from './faults.js'
import type { Random } from './random.js'

/** Each resolves `false` when the fault could not happen right now (no server running, say). */
export interface NemesisActions {
  /** SIGSTOP a server for `ms`, moving its traffic to another instance meanwhile, then SIGCONT it. */
  pauseServer(ms: number): Promise<boolean | undefined>
  /** Terminate the API's database connections. */
  killDbConnections(): Promise<boolean | undefined>
  /** Stop Postgres and start it again (only when the driver owns it). */
  restartDb(): Promise<boolean | undefined>
  /** Crash the primary and promote its standby (false while no standby is streaming). */
  failover(): Promise<boolean | undefined>
  /** Restart one Citus worker, cleanly or as a crash (only on a Citus cluster). */
  restartWorker(): Promise<boolean | undefined>
  /** Terminate every connection to the run's database on one Citus worker (only on a Citus cluster). */
  killWorkerConnections(): Promise<boolean | undefined>
  /** Restart PgBouncer on its port, cleanly or as a crash (only through the pooler). */
  restartPooler(): Promise<boolean | undefined>
  /**
   * Send one instance a burst of failing and slow payments, several times its pool size, with rounds of
   * `pg_terminate_backend` meanwhile; resolves once every request of the burst ended (false: no instance running).
   */
  saturatePool(): Promise<boolean | undefined>
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
    (f) =>
      f === 'pause-server' ||
      f === 'kill-db-connections' ||
      f === 'restart-db' ||
      f === 'failover' ||
      f === 'restart-worker' ||
      f === 'kill-worker-connections' ||
      f === 'restart-pooler' ||
      f === 'saturate-pool',
  )
  const mean = options.meanIntervalMs ?? 4000
  let stopped = kinds.length === 0
  let wake: (() => void) | undefined
  const loop = (async () => {
    // Each kind first, tried again later when it could not happen (the action resolved false), so even a short
    // run shows every kind; then seeded picks. A fault that failed is reported, not retried: it may have happened.
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
      const first = queue.shift()
      const kind = first ?? options.random.pick(kinds)
      let happened: boolean | undefined = true
      try {
        if (kind === 'pause-server') happened = await options.actions.pauseServer(options.pauseMs)
        else if (kind === 'restart-db') happened = await options.actions.restartDb()
        else if (kind === 'failover') happened = await options.actions.failover()
        else if (kind === 'saturate-pool') happened = await options.actions.saturatePool()
        else if (kind === 'restart-worker') happened = await options.actions.restartWorker()
        else if (kind === 'kill-worker-connections') happened = await options.actions.killWorkerConnections()
        else if (kind === 'restart-pooler') happened = await options.actions.restartPooler()
        else happened = await options.actions.killDbConnections()
      } catch (error) {
        options.onError?.(error)
      }
      if (first && happened === false) queue.push(first)
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
