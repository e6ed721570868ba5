/**
 * The checker: a pure function of the history and the final database. It never looks at logs or timing, only at
 * what clients were told and what the ledger holds, so the same inputs always give the same verdict.
 *
 * Effects are tied to intents by `(tenant, reference)`: the generator sets each request's `reference` to its
 * intent id (`reordered` and `expired-replay` probes keep their original's reference; `changed-payload` and
 * `expired-changed-payload` probes get their own).
 */
import { canonicalJson } from '@oncely/protocol'
import type {
  AttemptEvent,
  DrainEvent,
  FaultEvent,
  HistoryEvent,
  IntentEvent,
  IntentKind,
  ObservedResponse,
} from './history.js'
import { checkLiveness, type LivenessRule, type LivenessSummary } from './liveness.js'

/** A row of the demo's `payments` table. */
export interface PaymentRow {
  id: string
  tenantId: string
  amount: number
  currency: string
  reference: string | null
  chargeId: string | null
}

/** A charge recorded by the simulated provider. */
export interface ChargeRow {
  id: string
  tenantId: string
  amount: number
  currency: string
  /** The payment request's reference the charge was made for; `null` when it cannot be attributed. */
  reference: string | null
  /** `declined` charges moved no money and are not effects. @default 'succeeded' */
  status?: string
}

/** A row of the server's idempotency key table, with the stored response when it has one. */
export interface KeyRow {
  tenantId: string
  key: string
  /** `in_progress`, `succeeded`, `failed_permanent`, ... as the server names them. */
  state: string
  responseStatus: number | null
  responseBody: unknown
  /**
   * When the transaction that wrote the row began (milliseconds since the epoch, on the database's clock, the clock
   * of the run's own processes on one machine), when known: a row no earlier than its original's first send plus the
   * retention was written once that key could have expired.
   */
  createdAt?: number
}

/** A row of the demo's outbox; `paymentId` is the payment it announces. */
export interface OutboxRow {
  id: string
  paymentId: string | null
}

/** The ledger after the run, read once everything has healed and drained. */
export interface FinalDb {
  payments: PaymentRow[]
  charges: ChargeRow[]
  keys: KeyRow[]
  outbox: OutboxRow[]
}

/**
 * Jepsen-style outcome of one intent, judged by its effects:
 * - `ok`: what the client was told matches the ledger.
 * - `recovered`: consistent, after an indeterminate step (a timeout, a crash, a resume).
 * - `aborted`: never acknowledged, no effect, not pending: the client died before the intent was durable.
 * - `lost`: acknowledged as created, but no effect.
 * - `duplicated`: more than one payment or provider charge.
 * - `unexpected`: an effect although the outcome was a definite failure.
 * - `lost-in-failover`: acknowledged as created just before a failover under asynchronous replication, and the
 *   payment it was told about is gone: the promoted standby never received its commit. Not a violation under `async`
 *   (it is what asynchronous replication trades for latency); its key went with it, so a retry runs it again and the
 *   provider's step key returns the charge it already took.
 */
export type IntentClass =
  | 'ok'
  | 'recovered'
  | 'aborted'
  | 'lost'
  | 'duplicated'
  | 'unexpected'
  | 'lost-in-failover'

export const INTENT_CLASSES: readonly IntentClass[] = [
  'ok',
  'recovered',
  'aborted',
  'lost',
  'duplicated',
  'unexpected',
  'lost-in-failover',
]

/** An acknowledged payment an asynchronous failover lost, and what became of its intent. */
export interface LostTransaction {
  intent: string
  key: string
  /** The payment the client was told about, gone from the ledger. */
  payment: string
  /** Its provider charge (kept by the provider, which is another system). */
  chargeId: string | null
  /** The payment a retry after the failover recorded instead, if one did, with its charge. */
  redone?: { payment: string; chargeId: string | null }
}

/**
 * Acknowledgements recorded up to this long before a failover began may be lost by it: their commit may not have
 * reached the standby yet when the replication was held back (the driver records an answer after it arrived).
 */
export const FAILOVER_MARGIN_MS = 2000

/** The rules, one name each; docs/chaos.md explains them. */
export type Rule =
  | 'duplicate-payment'
  | 'duplicate-payment-for-charge'
  | 'duplicate-charge'
  | 'lost-acknowledged'
  | 'acks-disagree'
  | 'ack-differs-from-stored'
  | 'ack-differs-from-effect'
  | 'effect-after-failure'
  | 'effect-without-intent'
  | 'effect-differs-from-request'
  | 'outbox-mismatch'
  | 'payload-mismatch-accepted'
  | 'refusal-not-final'
  | 'unsettled-intent'
  | 'key-in-flight'
  | 'stored-response-without-effect'
  | 'replayed-lost-effect'
  | LivenessRule

export interface Violation {
  rule: Rule
  message: string
  intent?: string
  key?: string
  /** History lines (event indices) that show it. */
  lines: number[]
  /** Ledger rows that show it. */
  rows?: unknown[]
}

export interface CheckResult {
  valid: boolean
  classes: Record<string, IntentClass>
  counts: Record<IntentClass, number>
  violations: Violation[]
  /** What asynchronous failovers lost (empty under synchronous replication, where a loss is a violation). */
  lostInFailover: LostTransaction[]
  /** What the liveness rules measured (their violations are among `violations`). */
  liveness: LivenessSummary
}

/** Responses the server stores and must replay verbatim: successes and permanent business refusals (402). */
export function isStoredOutcome(status: number): boolean {
  return (status >= 200 && status < 300) || status === 402
}

interface Intent {
  id: string
  tenant: string
  key: string
  invoke: IntentEvent
  events: Array<IntentEvent | AttemptEvent>
}

const same = (a: unknown, b: unknown) => canonicalJson(a) === canonicalJson(b)
const scoped = (tenant: string, name: string | null) => `${tenant}\u0000${name ?? ''}`

/** What the checker knows of the run beyond its history. */
export interface CheckOptions {
  /**
   * How long the server keeps a finished key (`--retention`). A probe sent this long after its original was first
   * sent may find the key expired and run as a new request. Without it, no probe is taken to have.
   */
  retentionMs?: number
}

/** Checks a history against the final ledger. Pure: same inputs, same verdict. */
export function check(
  history: readonly HistoryEvent[],
  db: FinalDb,
  options: CheckOptions = {},
): CheckResult {
  const intents = collectIntents(history)
  const violations: Violation[] = []
  const classes: Record<string, IntentClass> = {}
  const payments = groupBy(db.payments, (row) => scoped(row.tenantId, row.reference))
  const paymentIds = new Set(db.payments.map((row) => row.id))
  // Acknowledgements an asynchronous failover may have lost, whose payment is indeed gone.
  const mayBeLost = coveredByAsyncFailover(history)
  const sentAt = attemptSendTimes(intents)
  const lostAck = (event: AckEvent) => {
    const payment = paymentIdOf(event.response)
    return (
      event.response.status < 300 &&
      payment !== '' &&
      !paymentIds.has(payment) &&
      mayBeLost(event, sentAt(event))
    )
  }
  const lostPayments = new Map<string, LostTransaction>()
  for (const intent of intents.values()) {
    for (const event of ackEvents(intent).filter(lostAck)) {
      const body = event.response.body as Record<string, unknown>
      lostPayments.set(paymentIdOf(event.response), {
        intent: intent.id,
        key: intent.key,
        payment: paymentIdOf(event.response),
        chargeId: typeof body.chargeId === 'string' ? body.chargeId : null,
      })
    }
  }
  // A charge whose payment the failover lost is still the lost intent's: attribute it through the acknowledgement.
  const lostCharges = new Map<string, string | null>()
  for (const lost of lostPayments.values()) {
    const intent = intents.get(lost.intent)!
    if (lost.chargeId)
      lostCharges.set(scoped(intent.tenant, lost.chargeId), intent.invoke.body?.reference ?? null)
  }
  const charges = groupBy(
    db.charges.filter((row) => row.status !== 'declined'),
    (row) => scoped(row.tenantId, row.reference ?? lostCharges.get(scoped(row.tenantId, row.id)) ?? null),
  )
  const keyRows = new Map(db.keys.map((row) => [scoped(row.tenantId, row.key), row]))
  const takenByProbe = keysTakenByChangedPayload(intents, keyRows, options.retentionMs)
  const pending = pendingAfterDrain(history)
  const claimed = new Set<string>()
  const keyAcks = new Map<string, Array<{ ack: ObservedResponse; intent: Intent }>>()

  for (const intent of intents.values()) {
    const lines = intent.events.map((event) => event.index)
    const base = { intent: intent.id, key: intent.key, lines }
    const responses = observed(intent)
    const stored = ackEvents(intent)
    const lostHere = stored.filter(lostAck)
    // After a failover, a replay of a response whose effect it lost: the key survived without its effect.
    for (const event of stored.filter((e) => !lostAck(e) && lostPayments.has(paymentIdOf(e.response)))) {
      violations.push({
        ...base,
        rule: 'replayed-lost-effect',
        message: `answered with payment ${paymentIdOf(event.response)}, which the failover lost`,
        lines: [...lines],
      })
    }
    // What the client was told and the ledger must still show; a lost acknowledgement is judged above.
    const acks = stored
      .filter((e) => !lostHere.includes(e) && !lostPayments.has(paymentIdOf(e.response)))
      .map((e) => e.response)
    const definite = settlement(intent)
    const reference = intent.invoke.body?.reference ?? null
    const ref = scoped(intent.tenant, reference)
    claimed.add(ref)
    const paid = payments.get(ref) ?? []
    const charged = charges.get(ref) ?? []
    const kind = intent.invoke.kind ?? 'normal'
    // A probe with another amount on its original's key: refused, whether the key lives (422 from the fingerprint)
    // or expired (422 from the provider, stored); it has its own reference, so any effect of it is an effect too many.
    const changed = changesPayload(kind)
    // Reordered and expired-replay probes share their original's effect; only the original answers for its count.
    const ownsEffect = kind === 'normal' || changed || kind === 'saturation'

    if (ownsEffect && paid.length > 1) {
      violations.push({ ...base, rule: 'duplicate-payment', message: `${paid.length} payments`, rows: paid })
    }
    if (ownsEffect && charged.length > 1) {
      violations.push({
        ...base,
        rule: 'duplicate-charge',
        message: `${charged.length} charges`,
        rows: charged,
      })
    }
    for (const row of ownsEffect ? paid : []) {
      const body = intent.invoke.body
      if (body && (row.amount !== body.amount || row.currency !== body.currency)) {
        violations.push({
          ...base,
          rule: 'effect-differs-from-request',
          message: `payment ${row.id} is ${row.amount} ${row.currency}, asked ${body.amount} ${body.currency}`,
          rows: [row],
        })
      }
    }

    // Sent again until it got a final answer after the faults healed (see settle): a request the server can never
    // serve must be refused for good, or a client retries it for ever.
    if (kind === 'expired-changed-payload' && !definite) {
      violations.push({
        ...base,
        rule: 'refusal-not-final',
        message: 'a key reused with another amount after it expired got no final answer (expected 422)',
      })
    }
    if (changed) {
      const wrong = responses.filter((r) => r.status !== 422 && (isStoredOutcome(r.status) || r === definite))
      if (wrong.length > 0) {
        violations.push({
          ...base,
          rule: 'payload-mismatch-accepted',
          message: `changed payload answered ${wrong.map((r) => r.status).join(', ')}, expected 422`,
        })
      }
    }

    const group = scoped(intent.tenant, intent.key)
    if (!changed) {
      keyAcks.set(group, [...(keyAcks.get(group) ?? []), ...acks.map((ack) => ({ ack, intent }))])
    }
    const keyRow = keyRows.get(group)
    if (keyRow && keyRow.responseStatus !== null && !changed && !takenByProbe.has(group)) {
      const expected = { status: keyRow.responseStatus, body: keyRow.responseBody }
      for (const ack of acks.filter((a) => !same(a, expected))) {
        violations.push({
          ...base,
          rule: 'ack-differs-from-stored',
          message: `told ${canonicalJson(ack)}, stored ${canonicalJson(expected)}`,
          rows: [keyRow],
        })
      }
    }

    const created = acks.filter((ack) => ack.status >= 200 && ack.status < 300)
    if (created.length > 0 && paid.length === 0) {
      violations.push({ ...base, rule: 'lost-acknowledged', message: 'acknowledged as created, no payment' })
    }
    for (const ack of paid.length === 1 ? created : []) {
      const row = paid[0]!
      if (!matchesPayment(ack.body, row)) {
        violations.push({
          ...base,
          rule: 'ack-differs-from-effect',
          message: `told ${canonicalJson(ack.body)}, payment row ${canonicalJson(row)}`,
          rows: [row],
        })
      }
    }
    const refused = definite !== undefined && !(definite.status >= 200 && definite.status < 300)
    const effectAfterFailure = ownsEffect && paid.length > 0 && (refused || changed)
    if (effectAfterFailure) {
      violations.push({
        ...base,
        rule: 'effect-after-failure',
        message: `settled as ${definite?.status ?? 'failed'} but ${paid.length} payment(s) exist`,
        rows: paid,
      })
    }

    if (pending.has(intent.id)) {
      violations.push({
        ...base,
        rule: 'unsettled-intent',
        message: 'still pending after the final drain',
        lines: [...lines, ...pending.get(intent.id)!],
      })
    }

    for (const event of lostHere) {
      const lost = lostPayments.get(paymentIdOf(event.response))!
      const redone = paid[0]
      if (ownsEffect && redone) lost.redone = { payment: redone.id, chargeId: redone.chargeId }
    }
    classes[intent.id] = classify({
      lostInFailover: lostHere.length > 0,
      duplicated: ownsEffect && (paid.length > 1 || charged.length > 1),
      lost: created.length > 0 && paid.length === 0,
      unexpected: effectAfterFailure,
      effect: paid.length > 0,
      settled: definite !== undefined || acks.length > 0,
      indeterminate: intent.events.some((event) => event.phase === 'info'),
    })
  }

  // Every acknowledgement for one key must be the same response, whichever intent (original or probe) got it.
  for (const acks of keyAcks.values()) {
    const first = acks[0]
    if (!first || acks.every(({ ack }) => same(ack, first.ack))) continue
    violations.push({
      rule: 'acks-disagree',
      message: `acknowledgements differ: ${[...new Set(acks.map(({ ack }) => canonicalJson(ack)))].join(' vs ')}`,
      intent: first.intent.id,
      key: first.intent.key,
      lines: [...new Set(acks.flatMap(({ intent }) => intent.events.map((event) => event.index)))],
    })
  }

  for (const [ref, rows] of payments) {
    if (!claimed.has(ref)) {
      violations.push({ rule: 'effect-without-intent', message: 'payment nobody asked for', lines: [], rows })
    }
  }
  for (const [ref, rows] of charges) {
    if (!claimed.has(ref)) {
      violations.push({ rule: 'effect-without-intent', message: 'charge nobody asked for', lines: [], rows })
    }
  }
  violations.push(...checkPaymentPerCharge(db))
  violations.push(...checkOutbox(db))
  // A key must not keep a response whose effect is gone: a retry would be answered for nothing.
  for (const row of db.keys) {
    if (row.responseStatus === null || row.responseStatus >= 300) continue
    const payment = paymentIdOf({ status: row.responseStatus, body: row.responseBody })
    if (paymentIds.has(payment)) continue
    violations.push({
      rule: 'stored-response-without-effect',
      message: `key ${row.key} stores ${row.responseStatus} for payment ${payment}, which the ledger does not hold`,
      key: row.key,
      lines: [],
      rows: [row],
    })
  }
  // A key whose completion a failover lost keeps the leased row its recovery point wrote, until a retry comes.
  const lostKeys = new Set(
    [...lostPayments.values()].map((lost) => scoped(intents.get(lost.intent)!.tenant, lost.key)),
  )
  for (const row of db.keys.filter(
    (row) => row.state === 'in_progress' && !lostKeys.has(scoped(row.tenantId, row.key)),
  )) {
    violations.push({
      rule: 'key-in-flight',
      message: `key ${row.key} is still in progress after the final drain`,
      key: row.key,
      lines: [...intents.values()]
        .filter((intent) => intent.key === row.key && intent.tenant === row.tenantId)
        .map((intent) => intent.invoke.index),
      rows: [row],
    })
  }

  const liveness = checkLiveness(history)
  violations.push(...liveness.violations)

  const counts = Object.fromEntries(INTENT_CLASSES.map((c) => [c, 0])) as Record<IntentClass, number>
  for (const c of Object.values(classes)) counts[c]++
  return {
    valid: violations.length === 0,
    classes,
    counts,
    violations,
    lostInFailover: [...lostPayments.values()],
    liveness: liveness.summary,
  }
}

function classify(facts: {
  lostInFailover: boolean
  duplicated: boolean
  lost: boolean
  unexpected: boolean
  effect: boolean
  settled: boolean
  indeterminate: boolean
}): IntentClass {
  if (facts.duplicated) return 'duplicated'
  if (facts.lost) return 'lost'
  if (facts.unexpected) return 'unexpected'
  if (facts.lostInFailover) return 'lost-in-failover'
  if (!facts.settled && !facts.effect) return 'aborted'
  return facts.indeterminate || !facts.settled ? 'recovered' : 'ok'
}

function collectIntents(history: readonly HistoryEvent[]): Map<string, Intent> {
  const intents = new Map<string, Intent>()
  for (const event of history) {
    if (event.type !== 'intent' && event.type !== 'attempt') continue
    if (event.type === 'intent' && event.phase === 'invoke') {
      intents.set(event.intent, {
        id: event.intent,
        tenant: event.tenant,
        key: '',
        invoke: event,
        events: [event],
      })
      continue
    }
    // Completions of an intent never invoked cannot be judged; they come from a corrupt history.
    intents.get(event.intent)?.events.push(event)
  }
  // The SDK derives keys, so an invoke may lack one: the first event that carries it names it.
  for (const intent of intents.values()) intent.key = intent.events.find((event) => event.key)?.key ?? ''
  return intents
}

/**
 * When the attempt that an answer came from was sent, by the worker's clock: the intent's last attempt sent before
 * the answer was received. Undefined for histories without those times.
 */
/** Whether a probe of `kind` sends its original's key with another amount. */
function changesPayload(kind: IntentKind): boolean {
  return kind === 'changed-payload' || kind === 'expired-changed-payload'
}

/**
 * Keys whose final row a probe with another amount wrote: an `expired-changed-payload` probe, sent once the key
 * expired, or a `changed-payload` probe that kept retrying while its original held the key and outlived the key's
 * retention. Its attempt is then a new request on the expired key, which the demo's provider refuses with a final
 * 422 that the key stores (its step key was first used for another amount). The key's row is then the probe's, and
 * the original's answers are no longer what it stores.
 *
 * The row is the probe's when it stores the probe's answer, or the provider's refusal of a reused key, which only a
 * request with another amount than the original's runs into: the attempt that stored it may be one the client gave
 * up on while the network held it, which reached the server after a later attempt had been answered. It was written
 * once the key could have expired when the transaction that wrote it began at least the retention after the original
 * was first sent (which is no later than the key's creation); without that time, when the probe's last attempt was
 * sent that late. A key overwritten while live is still reported.
 */
function keysTakenByChangedPayload(
  intents: Map<string, Intent>,
  keyRows: Map<string, KeyRow>,
  retentionMs: number | undefined,
): Set<string> {
  const taken = new Set<string>()
  if (retentionMs === undefined) return taken
  for (const probe of intents.values()) {
    if (!changesPayload(probe.invoke.kind ?? 'normal') || probe.invoke.of === undefined) continue
    const group = scoped(probe.tenant, probe.key)
    const row = keyRows.get(group)
    const answer = settlement(probe)
    const original = intents.get(probe.invoke.of)
    if (!row || row.responseStatus === null || !original) continue
    const stored = { status: row.responseStatus, body: row.responseBody }
    if (!(answer && same(answer, stored)) && !refusesReusedKey(stored)) continue
    const firstSent = Math.min(...sendTimes(original))
    const written = row.createdAt ?? Math.max(...sendTimes(probe))
    if (Number.isFinite(firstSent) && written >= firstSent + retentionMs) taken.add(group)
  }
  return taken
}

/** The demo provider's final refusal of a step key reused for another amount (`provider_key_reused`). */
function refusesReusedKey(response: ObservedResponse): boolean {
  const body = response.body as { code?: unknown } | null
  return response.status === 422 && body?.code === 'provider_key_reused'
}

/** When each attempt of `intent` was sent, as recorded. */
function sendTimes(intent: Intent): number[] {
  return intent.events.flatMap((event) =>
    event.type === 'attempt' && event.phase === 'invoke' && event.sentAt !== undefined ? [event.sentAt] : [],
  )
}

function attemptSendTimes(intents: Map<string, Intent>): (event: AckEvent) => number | undefined {
  const sends = new Map<string, number[]>()
  for (const intent of intents.values()) sends.set(intent.id, sendTimes(intent))
  return (event) => {
    const received = event.type === 'intent' ? event.receivedAt : undefined
    if (received === undefined) return undefined
    const before = (sends.get(event.intent) ?? []).filter((at) => at <= received)
    return before.length > 0 ? Math.max(...before) : undefined
  }
}

/** A completion that carried a stored outcome (2xx or 402), with when it was recorded. */
type AckEvent = (IntentEvent | AttemptEvent) & { response: ObservedResponse }

function ackEvents(intent: Intent): AckEvent[] {
  return intent.events.filter(
    (event): event is AckEvent =>
      event.phase !== 'invoke' && event.response !== undefined && isStoredOutcome(event.response.status),
  )
}

/** The payment id a 2xx answer names (`''` when it names none). */
function paymentIdOf(response: ObservedResponse): string {
  const id = (response.body as { id?: unknown } | null)?.id
  return typeof id === 'string' ? id : ''
}

/**
 * Whether an event falls where an asynchronous failover could lose what it reports: from shortly before the
 * replication was held back until the promoted standby served ({@link FAILOVER_MARGIN_MS}). Under synchronous
 * replication nothing is covered: whatever was acknowledged must survive.
 */
function coveredByAsyncFailover(
  history: readonly HistoryEvent[],
): (event: HistoryEvent, sentAt: number | undefined) => boolean {
  const windows: Array<{ from: number; until: number; untilTime: number }> = []
  let start: FaultEvent | undefined
  for (const event of history) {
    if (event.type !== 'fault' || event.fault !== 'failover') continue
    if (event.phase === 'start') start = event
    else if (event.phase === 'stop' && start && event.detail?.replication === 'async') {
      // The standby may have lagged before the failover began: the nemesis measured since when commits were missing.
      const lostSince = typeof event.detail.lostSince === 'number' ? event.detail.lostSince : start.time
      const from = Math.min(start.time, lostSince) - FAILOVER_MARGIN_MS
      windows.push({ from, until: event.index, untilTime: event.time })
      start = undefined
    }
  }
  // An answer is judged by the worker's own clock, the same machine's as the failover's events (its report can reach
  // the driver seconds later, or only after a restart): received once the standby stopped receiving, to a request
  // sent before the promoted standby served. The answer itself may arrive after that: the old primary committed it.
  return (event, sentAt) =>
    windows.some((w) => {
      const received = event.type === 'intent' ? event.receivedAt : undefined
      if (received === undefined) return event.time >= w.from && event.index < w.until
      return received >= w.from && (sentAt ?? received) <= w.untilTime
    })
}

function observed(intent: Intent): ObservedResponse[] {
  return intent.events.flatMap((event) =>
    event.phase !== 'invoke' && event.response ? [event.response] : [],
  )
}

/** The response of the last definite completion (`ok` or `fail`) of the intent itself, if any. */
function settlement(intent: Intent): ObservedResponse | undefined {
  const done = intent.events.filter(
    (event): event is IntentEvent =>
      event.type === 'intent' && (event.phase === 'ok' || event.phase === 'fail'),
  )
  const last = done.at(-1)
  if (!last) return undefined
  return last.response ?? { status: 0, body: last.error ?? null }
}

/** Intents pending in each process's last drain report (an earlier drain may have been followed by a resume). */
function pendingAfterDrain(history: readonly HistoryEvent[]): Map<string, number[]> {
  const last = new Map<string, DrainEvent>()
  for (const event of history) if (event.type === 'drain') last.set(event.process, event)
  const pending = new Map<string, number[]>()
  for (const event of last.values()) {
    for (const id of event.pending) pending.set(id, [...(pending.get(id) ?? []), event.index])
  }
  return pending
}

function matchesPayment(body: unknown, row: PaymentRow): boolean {
  if (typeof body !== 'object' || body === null) return false
  const b = body as Record<string, unknown>
  return (
    b.id === row.id &&
    b.amount === row.amount &&
    b.currency === row.currency &&
    (b.reference ?? null) === row.reference &&
    (b.chargeId ?? null) === row.chargeId
  )
}

/**
 * The ledger's natural key: one payment per tenant and provider charge, whoever asked. A retry whose key expired is
 * a new request with the same provider charge, so this is what tells a second payment for it.
 */
function checkPaymentPerCharge(db: FinalDb): Violation[] {
  const violations: Violation[] = []
  const byCharge = groupBy(
    db.payments.filter((row) => row.chargeId !== null),
    (row) => scoped(row.tenantId, row.chargeId),
  )
  for (const rows of byCharge.values()) {
    if (rows.length < 2) continue
    violations.push({
      rule: 'duplicate-payment-for-charge',
      message: `${rows.length} payments for charge ${rows[0]!.chargeId}`,
      lines: [],
      rows,
    })
  }
  return violations
}

function checkOutbox(db: FinalDb): Violation[] {
  const violations: Violation[] = []
  const byPayment = groupBy(db.outbox, (row) => row.paymentId ?? '')
  const paymentIds = new Set(db.payments.map((row) => row.id))
  for (const payment of db.payments) {
    const rows = byPayment.get(payment.id) ?? []
    if (rows.length !== 1) {
      violations.push({
        rule: 'outbox-mismatch',
        message: `payment ${payment.id} has ${rows.length} outbox rows, expected 1`,
        lines: [],
        rows: [payment, ...rows],
      })
    }
  }
  for (const [paymentId, rows] of byPayment) {
    if (!paymentIds.has(paymentId)) {
      violations.push({
        rule: 'effect-without-intent',
        message: 'outbox row for no payment',
        lines: [],
        rows,
      })
    }
  }
  return violations
}

function groupBy<T>(rows: readonly T[], keyOf: (row: T) => string): Map<string, T[]> {
  const groups = new Map<string, T[]>()
  for (const row of rows) {
    const key = keyOf(row)
    groups.set(key, [...(groups.get(key) ?? []), row])
  }
  return groups
}
