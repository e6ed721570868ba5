/**
 * Liveness, judged next to safety: every request the suite sends straight to an instance (the pool-saturating
 * bursts, and the monitor's `GET /healthz`) must be answered within its bound. A process that dies answers too, by
 * breaking the connection; what this catches is an instance that is alive and answers nothing, such as one whose
 * connection pool deadlocked. Requests through the fault proxies are left out: the proxies delay and swallow
 * requests on purpose.
 *
 * Pure, like the checker: a function of the history only.
 */
import type { Violation } from './checker.js'
import type { AttemptEvent, HealthEvent, HistoryEvent } from './history.js'

/**
 * A database outage (a restart, a failover) is time no answer can be expected in: through PgBouncer a query waits for
 * the server to come back. For a request in flight during one, the bound counts from this long after the outage
 * ended; a request that hangs on after it (a deadlocked pool outlives the outage) is still caught.
 */
export const OUTAGE_GRACE_MS = 5_000

/** What the liveness rules measured, for the report. */
export interface LivenessSummary {
  /** Payment requests sent straight to an instance, and how many were not answered within their bound. */
  requests: number
  unansweredRequests: number
  /** The longest wait for one of them, in ms (the request, and whether it was answered at all). */
  slowestRequest?: Wait
  /** Health probes, and how many were not answered within their bound. */
  healthProbes: number
  unansweredHealth: number
  slowestHealth?: Wait
  /** Requests whose bound counted from the end of a database outage they overlapped. */
  overlappedOutage: number
}

export interface Wait {
  what: string
  ms: number
  answered: boolean
}

export type LivenessRule = 'unanswered-request' | 'unanswered-health'

/** Judges every request that carries a bound; see the module comment. */
export function checkLiveness(history: readonly HistoryEvent[]): {
  violations: Array<Violation & { rule: LivenessRule }>
  summary: LivenessSummary
} {
  const outages = outageWindows(history)
  /** When a wait from `sentAt` to `until` starts counting: after the outages it overlaps (and their grace). */
  const counted = (sentAt: number, until: number) => {
    let from = sentAt
    for (const w of outages)
      if (w.from <= until && from <= w.until + OUTAGE_GRACE_MS)
        from = Math.max(from, w.until + OUTAGE_GRACE_MS)
    return from
  }
  const violations: Array<Violation & { rule: LivenessRule }> = []
  const summary: LivenessSummary = {
    requests: 0,
    unansweredRequests: 0,
    healthProbes: 0,
    unansweredHealth: 0,
    overlappedOutage: 0,
  }
  const slowest = (current: Wait | undefined, next: Wait) =>
    !current || next.ms > current.ms ? next : current

  for (const request of watchedRequests(history)) {
    const { invoke, end } = request
    const answered = end?.receivedAt !== undefined
    const until = end?.receivedAt ?? end?.time ?? lastTime(history)
    const ms = until - invoke.sentAt!
    const from = counted(invoke.sentAt!, until)
    const what = `POST /v1/payments (intent ${invoke.intent}, attempt ${invoke.attempt}) to ${invoke.target}`
    summary.requests++
    if (from > invoke.sentAt!) summary.overlappedOutage++
    summary.slowestRequest = slowest(summary.slowestRequest, { what, ms, answered })
    if (until - from <= invoke.boundMs!) continue
    summary.unansweredRequests++
    violations.push({
      rule: 'unanswered-request',
      message: `${what} unanswered for ${seconds(ms)}${afterOutage(ms, until - from)} (bound ${seconds(invoke.boundMs!)}): ${ending(end)}`,
      intent: invoke.intent,
      key: invoke.key,
      lines: [invoke.index, ...(end ? [end.index] : [])],
    })
  }

  for (const probe of history.filter((e): e is HealthEvent => e.type === 'health')) {
    const answered = probe.receivedAt !== undefined
    const until = probe.receivedAt ?? probe.time
    const ms = until - probe.sentAt
    const from = counted(probe.sentAt, until)
    const what = `GET /healthz to ${probe.target}${probe.pid ? ` (pid ${probe.pid})` : ''}`
    summary.healthProbes++
    if (from > probe.sentAt) summary.overlappedOutage++
    summary.slowestHealth = slowest(summary.slowestHealth, { what, ms, answered })
    if (until - from <= probe.boundMs) continue
    summary.unansweredHealth++
    violations.push({
      rule: 'unanswered-health',
      message: `${what} unanswered for ${seconds(ms)}${afterOutage(ms, until - from)} (bound ${seconds(probe.boundMs)}): ${ending(probe)}`,
      lines: [probe.index],
    })
  }
  return { violations, summary }
}

/** How a wait ended, in words. */
function ending(end: AttemptEvent | HealthEvent | undefined): string {
  if (!end) return 'no end recorded'
  if (end.receivedAt === undefined) return end.error ?? 'still waiting when the run ended'
  if ('status' in end && end.status !== undefined) return `answered ${end.status} then`
  if (end.type === 'attempt' && end.response) return `answered ${end.response.status} then`
  return `then ${end.error ?? 'the connection ended'}`
}

/** Each attempt that carries a bound, with the event that ended it (none if the history stops first). */
function watchedRequests(
  history: readonly HistoryEvent[],
): Array<{ invoke: AttemptEvent; end: AttemptEvent | undefined }> {
  const open = new Map<string, { invoke: AttemptEvent; end: AttemptEvent | undefined }>()
  const all: Array<{ invoke: AttemptEvent; end: AttemptEvent | undefined }> = []
  for (const event of history) {
    if (event.type !== 'attempt') continue
    const id = `${event.intent}#${event.attempt}`
    if (event.phase === 'invoke') {
      if (event.boundMs === undefined || event.sentAt === undefined) continue
      const request = { invoke: event, end: undefined }
      open.set(id, request)
      all.push(request)
    } else {
      const request = open.get(id)
      if (!request || request.end) continue
      request.end = event
    }
  }
  return all
}

/**
 * The faults that take (part of) the database away: a restart, a failover, a Citus worker's restart, the pooler's
 * restart.
 */
const OUTAGES: readonly string[] = ['restart-db', 'failover', 'restart-worker', 'restart-pooler']

/** Outages of the database, from their start to their stop (the end of the history if none). */
function outageWindows(history: readonly HistoryEvent[]): Array<{ from: number; until: number }> {
  const windows: Array<{ from: number; until: number }> = []
  const started = new Map<string, number>()
  for (const event of history) {
    if (event.type !== 'fault' || !OUTAGES.includes(event.fault)) continue
    if (event.phase === 'start') started.set(event.fault, event.time)
    else if (event.phase === 'stop' && started.has(event.fault)) {
      windows.push({ from: started.get(event.fault)!, until: event.time })
      started.delete(event.fault)
    }
  }
  for (const from of started.values()) windows.push({ from, until: lastTime(history) })
  return windows
}

function lastTime(history: readonly HistoryEvent[]): number {
  return history.at(-1)?.time ?? 0
}

function afterOutage(total: number, counted: number): string {
  return counted < total ? `, ${seconds(counted)} of it once a database outage was over` : ''
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`
}
