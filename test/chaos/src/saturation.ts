/**
 * The pool-saturating burst: the nemesis sends a burst of payments (see `planBurst`) straight to one instance, past
 * its fault proxy, all at once, and several times the instance's pool size, most of them on the failure paths that
 * make an attempt want a second connection (a card refused with a thrown 402, a charge slower than the lease, a
 * processing error answered 503). Each request is retried like a client would (409, 5xx, a broken connection) until
 * a definite answer or its budget runs out, and each attempt is recorded with the bound its answer must come within:
 * an instance whose pool deadlocked answers nothing, and the liveness rules say which request waited, and how long.
 */
import type { BurstFlavor, PlannedIntent } from './generator.js'
import type { ObservedResponse, ReportedEvent } from './history.js'
import { PROBE_BUDGET_MS } from './probe-budget.js'

/** Where a burst goes: an instance, by its current incarnation (a restart moves it to another port). */
export interface BurstTarget {
  name: string
  port: number | undefined
}

export interface BurstOptions {
  intents: ReadonlyArray<PlannedIntent & { flavor?: BurstFlavor }>
  target: () => BurstTarget
  /** Appends to the history (the caller names the process). */
  record: (event: ReportedEvent) => void
  /** How long an answer may take; each attempt waits half as long again before it gives up. */
  boundMs: number
  /** An intent is retried until this long after its first attempt. @default PROBE_BUDGET_MS */
  budgetMs?: number
  /**
   * Sends intents that were already invoked once more (their earlier attempts ended without a definite answer):
   * no new `invoke` event, and attempts numbered after `firstAttempt - 1`.
   */
  again?: { firstAttempt: (intent: string) => number }
}

const PATH = '/v1/payments'

/**
 * One `saturate-pool` fault: the burst to one instance, with rounds of `pg_terminate_backend` at the given times
 * after its start, between a `start` and a `stop` fault event (the stop's detail says what came of it). Resolves
 * once every request of the burst ended.
 */
export async function saturate(options: {
  intents: ReadonlyArray<PlannedIntent & { flavor: BurstFlavor }>
  target: { name: string; port: () => number | undefined }
  record: (event: ReportedEvent) => void
  boundMs: number
  /** When to terminate the database's connections, in ms after the burst started. */
  terminateAt: readonly number[]
  /** Terminates them; resolves how many. */
  terminate: () => Promise<number>
}): Promise<void> {
  const { intents, target, record } = options
  const flavors: Record<string, number> = {}
  for (const { flavor } of intents) flavors[flavor] = (flavors[flavor] ?? 0) + 1
  record({ type: 'fault', fault: 'saturate-pool', target: target.name, phase: 'start' })
  const started = Date.now()
  const burst = sendBurst({
    intents,
    target: () => ({ name: target.name, port: target.port() }),
    record,
    boundMs: options.boundMs,
  })
  // Rounds of pg_terminate_backend while the burst holds the pool (what a restart or a failover does).
  const terminated: number[] = []
  for (const at of options.terminateAt) {
    await new Promise((r) => setTimeout(r, Math.max(0, started + at - Date.now())))
    terminated.push(await options.terminate().catch(() => -1))
  }
  const { definite, indefinite } = await burst
  const detail = { size: intents.length, flavors, terminated, definite, indefinite }
  record({ type: 'fault', fault: 'saturate-pool', target: target.name, phase: 'stop', detail })
}

/** Sends every intent at once; resolves when each has a definite answer or ran out of budget. */
export async function sendBurst(options: BurstOptions): Promise<{ definite: number; indefinite: number }> {
  const outcomes = await Promise.all(options.intents.map((intent) => sendIntent(intent, options)))
  const definite = outcomes.filter(Boolean).length
  return { definite, indefinite: outcomes.length - definite }
}

/** One intent's attempts; true when it ended with a definite answer (anything but 409, 5xx or no answer). */
async function sendIntent(
  intent: PlannedIntent & { flavor?: BurstFlavor },
  options: BurstOptions,
): Promise<boolean> {
  const { record, boundMs } = options
  const key = burstKey(intent.id)
  const base = { intent: intent.id, tenant: intent.tenant, key }
  if (!options.again) {
    record({ type: 'intent', phase: 'invoke', ...base, kind: intent.kind, body: intent.body })
  }
  const started = Date.now()
  const budget = options.budgetMs ?? PROBE_BUDGET_MS
  for (let attempt = options.again?.firstAttempt(intent.id) ?? 1; ; attempt++) {
    const target = options.target()
    const sentAt = Date.now()
    record({
      type: 'attempt',
      phase: 'invoke',
      intent: intent.id,
      key,
      attempt,
      sentAt,
      target: target.name,
      boundMs,
    })
    const answer = await post(target, intent, key, Math.round(boundMs * 1.5))
    const receivedAt = answer.response || answer.ended ? Date.now() : undefined
    const done = { intent: intent.id, key, attempt, ...(receivedAt === undefined ? {} : { receivedAt }) }
    if (answer.response) {
      record({ type: 'attempt', phase: 'ok', ...done, response: answer.response })
      const { status } = answer.response
      if (status !== 409 && status < 500) {
        const phase = status < 300 ? 'ok' : 'fail'
        record({ type: 'intent', phase, ...base, response: answer.response, receivedAt: receivedAt! })
        return true
      }
    } else {
      record({ type: 'attempt', phase: 'info', ...done, error: answer.error })
    }
    if (Date.now() - started > budget) break
    await new Promise((resolve) => setTimeout(resolve, Math.min(100 * attempt, 1000)))
  }
  record({ type: 'intent', phase: 'info', ...base, error: 'no definite answer within the budget' })
  return false
}

/**
 * One POST. `ended` says the connection ended (refused, reset: the instance died or was stopping): an answer, for
 * liveness. A request still waiting after `giveUpMs` is abandoned without one.
 */
async function post(
  target: BurstTarget,
  intent: PlannedIntent,
  key: string,
  giveUpMs: number,
): Promise<{ response?: ObservedResponse; ended?: boolean; error?: string }> {
  if (target.port === undefined) return { ended: true, error: `${target.name} is not running` }
  const timeout = AbortSignal.timeout(giveUpMs)
  try {
    const res = await fetch(`http://127.0.0.1:${target.port}${PATH}`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${intent.tenant}`,
        'content-type': 'application/json',
        'idempotency-key': key,
      },
      body: JSON.stringify(intent.body),
      signal: timeout,
    })
    const text = await res.text()
    return { response: { status: res.status, body: text ? parseJson(text) : null } }
  } catch (error) {
    if (timeout.aborted) return { error: `no answer within ${giveUpMs} ms, given up` }
    return { ended: true, error: String((error as Error).cause ?? error) }
  }
}

/** The idempotency key of a burst intent: fresh per intent, stable across its attempts. */
export function burstKey(intent: string): string {
  return `saturation-${intent}`
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    return text
  }
}
