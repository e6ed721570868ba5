import { describe, expect, it } from 'vitest'
import { check, type FinalDb, type KeyRow, type PaymentRow } from '../src/checker.js'
import type { HistoryEvent, IntentKind, NewEvent, ObservedResponse, PaymentBody } from '../src/history.js'

/** Builds histories by hand, numbering events like HistoryWriter does. */
function history() {
  const events: HistoryEvent[] = []
  const add = (event: NewEvent) => {
    const full = { ...event, index: events.length + 1, time: 1000 + events.length } as HistoryEvent
    events.push(full)
    return full.index
  }
  const api = {
    events,
    add,
    invoke(intent: string, body: PaymentBody, extra: { key?: string; kind?: IntentKind; of?: string } = {}) {
      return add({
        type: 'intent',
        phase: 'invoke',
        process: 'worker-1',
        intent,
        tenant: 't1',
        key: extra.key ?? `k-${intent}`,
        kind: extra.kind ?? 'normal',
        body,
        ...(extra.of ? { of: extra.of } : {}),
      })
    },
    /** An attempt sent at `sentAt`. */
    send(intent: string, attempt: number, sentAt: number, key = `k-${intent}`) {
      return add({ type: 'attempt', phase: 'invoke', process: 'worker-1', intent, key, attempt, sentAt })
    },
    attempt(intent: string, attempt: number, response?: ObservedResponse, key = `k-${intent}`) {
      return add({
        type: 'attempt',
        phase: response ? 'ok' : 'info',
        process: 'worker-1',
        intent,
        key,
        attempt,
        ...(response ? { response } : { error: 'socket hang up' }),
      })
    },
    settle(
      intent: string,
      phase: 'ok' | 'fail' | 'info',
      response?: ObservedResponse,
      key = `k-${intent}`,
      receivedAt?: number,
    ) {
      return add({
        type: 'intent',
        phase,
        process: 'worker-1',
        intent,
        tenant: 't1',
        key,
        ...(response ? { response } : { error: 'outcome unknown' }),
        ...(receivedAt === undefined ? {} : { receivedAt }),
      })
    },
    failover(phase: 'start' | 'stop', replication: 'sync' | 'async') {
      return add({
        type: 'fault',
        fault: 'failover',
        target: 'postgres',
        phase,
        process: 'nemesis',
        detail: { replication },
      })
    },
    drain(pending: string[]) {
      return add({ type: 'drain', process: 'worker-1', pending })
    },
  }
  return api
}

const payment = (intent: string, n: number, extra: Partial<PaymentRow> = {}): PaymentRow => ({
  id: `pay_${intent}_${n}`,
  tenantId: 't1',
  amount: 100,
  currency: 'eur',
  reference: intent,
  chargeId: `ch_${intent}_${n}`,
  ...extra,
})
const created = (row: PaymentRow): ObservedResponse => ({
  status: 201,
  body: {
    id: row.id,
    amount: row.amount,
    currency: row.currency,
    reference: row.reference,
    status: 'succeeded',
    chargeId: row.chargeId,
  },
})
const body = (intent: string, amount = 100): PaymentBody => ({ amount, currency: 'eur', reference: intent })

/** A ledger where each listed payment has its charge, its outbox row and a succeeded key row replaying it. */
function ledger(rows: PaymentRow[], extra: Partial<FinalDb> = {}): FinalDb {
  return {
    payments: rows,
    charges: rows.map((row) => ({
      id: row.chargeId!,
      tenantId: row.tenantId,
      amount: row.amount,
      currency: row.currency,
      reference: row.reference,
    })),
    keys: rows.map((row) => ({
      tenantId: row.tenantId,
      key: `k-${row.reference}`,
      state: 'succeeded',
      responseStatus: 201,
      responseBody: created(row).body,
    })),
    outbox: rows.map((row) => ({ id: `ob_${row.id}`, paymentId: row.id })),
    ...extra,
  }
}

/** The ledger after a failover lost `lost`: no payment, and the charge the provider kept (it is another system). */
function lostInFailover(lost: PaymentRow): FinalDb {
  return ledger([], {
    charges: [{ id: lost.chargeId!, tenantId: 't1', amount: 100, currency: 'eur', reference: null }],
  })
}

const rules = (result: ReturnType<typeof check>) => result.violations.map((v) => v.rule).sort()

describe('check: valid histories', () => {
  it('accepts an acknowledged intent with exactly one payment, charge, outbox row and matching stored response', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.attempt('i1', 1, created(row))
    h.settle('i1', 'ok', created(row))
    const result = check(h.events, ledger([row]))
    expect(result.violations).toEqual([])
    expect(result.valid).toBe(true)
    expect(result.classes).toEqual({ i1: 'ok' })
  })

  it('classifies an intent that survived a lost response and was answered by a replay as recovered', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.attempt('i1', 1)
    h.attempt('i1', 2, created(row))
    h.settle('i1', 'ok', created(row))
    const result = check(h.events, ledger([row]))
    expect(result.valid).toBe(true)
    expect(result.classes.i1).toBe('recovered')
  })

  it('classifies an unacknowledged intent whose effect exists as recovered, and one without effect as aborted', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.invoke('i2', body('i2'))
    const result = check(h.events, ledger([row]))
    expect(result.valid).toBe(true)
    expect(result.classes).toEqual({ i1: 'recovered', i2: 'aborted' })
  })

  it('accepts a decline (402) that is replayed identically and leaves no payment', () => {
    const h = history()
    const declined = { status: 402, body: { type: 'card_declined', status: 402 } }
    h.invoke('i1', body('i1', 2_000_000))
    h.attempt('i1', 1, declined)
    h.attempt('i1', 2, declined)
    h.settle('i1', 'fail', declined)
    const db = ledger([], {
      keys: [
        {
          tenantId: 't1',
          key: 'k-i1',
          state: 'failed_permanent',
          responseStatus: 402,
          responseBody: declined.body,
        },
      ],
      // The provider records declines too; they moved no money, so they are neither duplicates nor strays.
      charges: ['ch_d1', 'ch_d2'].map((id) => ({
        id,
        tenantId: 't1',
        amount: 2_000_000,
        currency: 'eur',
        reference: null,
        status: 'declined',
      })),
    })
    const result = check(h.events, db)
    expect(result.violations).toEqual([])
    expect(result.classes.i1).toBe('ok')
  })

  it('accepts probes: a changed payload answered 422 with no effect, a reordered body answered with the replay', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    h.invoke(
      'p1',
      { amount: 999, currency: 'eur', reference: 'p1' },
      { key: 'k-i1', kind: 'changed-payload', of: 'i1' },
    )
    h.settle('p1', 'fail', { status: 422, body: { type: 'idempotency_key_reused' } }, 'k-i1')
    h.invoke(
      'p2',
      { reference: 'i1', currency: 'eur', amount: 100 },
      { key: 'k-i1', kind: 'reordered', of: 'i1' },
    )
    h.settle('p2', 'ok', created(row), 'k-i1')
    const result = check(h.events, ledger([row]))
    expect(result.violations).toEqual([])
    expect(result.classes).toEqual({ i1: 'ok', p1: 'ok', p2: 'ok' })
  })

  it('accepts an expired-replay probe answered with the original payment, the ledger unchanged', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    h.invoke('p1', body('i1'), { key: 'k-i1', kind: 'expired-replay', of: 'i1' })
    h.settle('p1', 'ok', created(row), 'k-i1')
    const result = check(h.events, ledger([row]))
    expect(result.violations).toEqual([])
    expect(result.classes).toEqual({ i1: 'ok', p1: 'ok' })
  })

  /**
   * A changed-payload probe that outlived its original's key (sent `probeSentAt` ms after the original): its last
   * attempt ran as a new request and the provider refused it with a final 422, which the key now stores.
   */
  /** The provider's final refusal of a step key reused for another amount, as the key then stores it. */
  const PROVIDER_REFUSED = { status: 422, body: { code: 'provider_key_reused' } }

  /**
   * `i1` paid at 0 under key `k-i1`, then a changed-payload probe `p1` of it invoked on that key (its sends and answer
   * left to the caller), and a ledger whose key row stores the provider's refusal, with `row` extra columns.
   */
  function paidThenChangedPayload(row: Partial<KeyRow> = {}) {
    const h = history()
    const paid = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.send('i1', 1, 0)
    h.settle('i1', 'ok', created(paid))
    h.invoke(
      'p1',
      { amount: 99, currency: 'eur', reference: 'p1' },
      { key: 'k-i1', kind: 'changed-payload', of: 'i1' },
    )
    const db = ledger([paid])
    db.keys = [
      {
        ...db.keys[0]!,
        state: 'failed_permanent',
        responseStatus: 422,
        responseBody: PROVIDER_REFUSED.body,
        ...row,
      },
    ]
    return { h, db }
  }

  function changedPayloadOnExpiredKey(probeSentAt: number) {
    const { h, db } = paidThenChangedPayload()
    h.send('p1', 1, probeSentAt, 'k-i1')
    h.settle('p1', 'fail', PROVIDER_REFUSED, 'k-i1')
    return { h, db }
  }

  it('accepts a changed payload that met an expired key: a stored 422 from the provider, nothing booked', () => {
    const { h, db } = changedPayloadOnExpiredKey(45_000)
    const result = check(h.events, db, { retentionMs: 45_000 })
    expect(result.violations).toEqual([])
    expect(result.classes.p1).toBe('ok')
  })

  /** An expired-changed-payload probe of `i1`, sent once the key expired, answered `answer`. */
  function expiredChangedPayload(answer: ObservedResponse) {
    const h = history()
    h.invoke('i1', body('i1'))
    h.send('i1', 1, 0)
    h.settle('i1', 'ok', created(payment('i1', 1)))
    h.invoke(
      'p1',
      { amount: 99, currency: 'eur', reference: 'p1' },
      { key: 'k-i1', kind: 'expired-changed-payload', of: 'i1' },
    )
    h.send('p1', 1, 46_000, 'k-i1')
    h.settle('p1', answer.status < 300 ? 'ok' : 'fail', answer, 'k-i1')
    return h.events
  }

  it('accepts an expired-changed-payload probe answered with the stored 422, and reports one that booked a payment', () => {
    const row = payment('i1', 1)
    const db = ledger([row])
    db.keys = [
      { ...db.keys[0]!, state: 'failed_permanent', responseStatus: 422, responseBody: PROVIDER_REFUSED.body },
    ]
    expect(check(expiredChangedPayload(PROVIDER_REFUSED), db, { retentionMs: 45_000 }).violations).toEqual([])

    // The server booked it instead (the provider charged the new amount under the old key).
    const booked = payment('p1', 1, { amount: 99 })
    const result = check(expiredChangedPayload(created(booked)), ledger([row, booked]), {
      retentionMs: 45_000,
    })
    expect(rules(result)).toEqual(
      expect.arrayContaining(['effect-after-failure', 'payload-mismatch-accepted']),
    )
  })

  it('reports an expired-changed-payload probe that never got a final answer (a retryable refusal, retried for ever)', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    h.invoke(
      'p1',
      { amount: 99, currency: 'eur', reference: 'p1' },
      { key: 'k-i1', kind: 'expired-changed-payload', of: 'i1' },
    )
    h.attempt('p1', 1, { status: 500, body: { code: 'internal' } }, 'k-i1')
    h.settle('p1', 'info', undefined, 'k-i1')
    const db = ledger([row])
    db.keys = [{ ...db.keys[0]!, state: 'failed_retryable', responseStatus: null, responseBody: null }]
    expect(rules(check(h.events, db, { retentionMs: 45_000 }))).toEqual(['refusal-not-final'])
  })

  /**
   * A changed-payload probe whose first attempt the client gave up on (sent at 42 s, before the key could expire)
   * while the network held it: its retry, sent at 44 s, was answered 422 from the fingerprint (the key still lived),
   * and the held attempt reached the server later, once the key had expired, ran as a new request and stored the
   * provider's 422. `createdAt`: when the stored row's transaction began, on the database's clock.
   */
  function abandonedAttemptRanLate(createdAt: number) {
    const { h, db } = paidThenChangedPayload({ createdAt })
    h.send('p1', 1, 42_000, 'k-i1')
    h.send('p1', 2, 44_000, 'k-i1')
    h.settle('p1', 'fail', { status: 422, body: { type: 'idempotency_key_reused' } }, 'k-i1')
    return { h, db }
  }

  it("accepts a changed payload's abandoned attempt that ran once the key expired, after its retry was told 422", () => {
    const { h, db } = abandonedAttemptRanLate(45_500)
    expect(check(h.events, db, { retentionMs: 45_000 }).violations).toEqual([])
    // Stored by a transaction that began before the key could expire: a key overwritten while it lived.
    const live = abandonedAttemptRanLate(44_500)
    expect(rules(check(live.h.events, live.db, { retentionMs: 45_000 }))).toEqual(['ack-differs-from-stored'])
  })

  it("reports a changed payload that overwrote a key before it could expire: the original's answer is gone", () => {
    const { h, db } = changedPayloadOnExpiredKey(44_000)
    expect(rules(check(h.events, db, { retentionMs: 45_000 }))).toEqual(['ack-differs-from-stored'])
    // Without the retention, no probe is taken to have met an expired key.
    expect(rules(check(h.events, changedPayloadOnExpiredKey(45_000).db))).toEqual(['ack-differs-from-stored'])
  })

  it('takes the key from the first attempt when the SDK derived it after the invoke', () => {
    const h = history()
    const row = payment('i1', 1)
    h.events.push({
      index: 1,
      time: 1,
      process: 'worker-1',
      type: 'intent',
      phase: 'invoke',
      intent: 'i1',
      tenant: 't1',
      kind: 'normal',
      body: body('i1'),
    })
    h.attempt('i1', 1, created(row))
    h.settle('i1', 'ok', { status: 201, body: { id: 'other' } })
    const result = check(h.events, ledger([row]))
    expect(result.violations.find((v) => v.rule === 'ack-differs-from-stored')?.key).toBe('k-i1')
  })

  it('ignores responses that are not stored outcomes (409 in progress, 503 transient) when comparing acks', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.attempt('i1', 1, { status: 503, body: { type: 'provider_unavailable' } })
    h.attempt('i1', 2, { status: 409, body: { type: 'in_progress' } })
    h.attempt('i1', 3, created(row))
    h.settle('i1', 'ok', created(row))
    expect(check(h.events, ledger([row])).valid).toBe(true)
  })
})

describe('check: histories that must produce violations', () => {
  it('reports a second payment for one charge (an expired-replay booked without the natural key)', () => {
    const h = history()
    const first = payment('i1', 1)
    const second = payment('i1', 2, { chargeId: first.chargeId })
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(first))
    h.invoke('p1', body('i1'), { key: 'k-i1', kind: 'expired-replay', of: 'i1' })
    h.settle('p1', 'ok', created(second), 'k-i1')
    const db = ledger([first, second])
    db.charges = [db.charges[0]!]
    db.keys = [db.keys[1]!]
    const result = check(h.events, db)
    expect(rules(result)).toEqual([
      'ack-differs-from-stored',
      'acks-disagree',
      'duplicate-payment',
      'duplicate-payment-for-charge',
    ])
    const perCharge = result.violations.find((v) => v.rule === 'duplicate-payment-for-charge')!
    expect(perCharge.rows).toEqual([first, second])
    expect(result.classes.i1).toBe('duplicated')
    // The probe shares its original's effect: the duplicate is counted once, against the original.
    expect(result.violations.filter((v) => v.rule === 'duplicate-payment').map((v) => v.intent)).toEqual([
      'i1',
    ])
  })

  it('reports a duplicate payment and charge (what idempotency off produces) and classifies it duplicated', () => {
    const h = history()
    const first = payment('i1', 1)
    const second = payment('i1', 2)
    const invoke = h.invoke('i1', body('i1'))
    const a1 = h.attempt('i1', 1)
    const a2 = h.attempt('i1', 2, created(second))
    h.settle('i1', 'ok', created(second))
    const db = ledger([first, second])
    db.keys = [db.keys[1]!]
    const result = check(h.events, db)
    expect(result.valid).toBe(false)
    expect(rules(result)).toEqual(['duplicate-charge', 'duplicate-payment'])
    expect(result.classes.i1).toBe('duplicated')
    const duplicate = result.violations.find((v) => v.rule === 'duplicate-payment')!
    expect(duplicate.lines).toEqual(expect.arrayContaining([invoke, a1, a2]))
    expect(duplicate.rows).toEqual([first, second])
  })

  it('reports a duplicated provider charge even when the payment row is unique', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    const db = ledger([row])
    db.charges.push({ ...db.charges[0]!, id: 'ch_second' })
    const result = check(h.events, db)
    expect(rules(result)).toEqual(['duplicate-charge'])
    expect(result.classes.i1).toBe('duplicated')
  })

  it('reports an acknowledged intent without its effect as lost', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    const result = check(h.events, ledger([]))
    expect(rules(result)).toEqual(['lost-acknowledged'])
    expect(result.classes.i1).toBe('lost')
  })

  it('reports two different acknowledgements for one key (a re-execution instead of a replay)', () => {
    const h = history()
    const kept = payment('i1', 1)
    const other = payment('i1', 2)
    h.invoke('i1', body('i1'))
    h.attempt('i1', 1, created(other))
    h.attempt('i1', 2, created(kept))
    h.settle('i1', 'ok', created(kept))
    const result = check(h.events, ledger([kept]))
    expect(rules(result)).toEqual(['ack-differs-from-effect', 'ack-differs-from-stored', 'acks-disagree'])
  })

  it('reports an acknowledgement that differs from the stored response across intents of one key', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    h.invoke(
      'p2',
      { currency: 'eur', amount: 100, reference: 'i1' },
      { key: 'k-i1', kind: 'reordered', of: 'i1' },
    )
    h.settle('p2', 'ok', { status: 201, body: { id: 'pay_other' } }, 'k-i1')
    const result = check(h.events, ledger([row]))
    expect(rules(result)).toEqual(['ack-differs-from-effect', 'ack-differs-from-stored', 'acks-disagree'])
    expect(result.violations.find((v) => v.rule === 'ack-differs-from-stored')?.intent).toBe('p2')
  })

  it('reports acknowledgements that disagree with each other even when no key row exists (idempotency off)', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    h.invoke(
      'p2',
      { currency: 'eur', amount: 100, reference: 'i1' },
      { key: 'k-i1', kind: 'reordered', of: 'i1' },
    )
    h.settle('p2', 'ok', created(payment('i1', 2)), 'k-i1')
    const result = check(h.events, { ...ledger([row]), keys: [] })
    expect(rules(result)).toContain('acks-disagree')
  })

  it('reports a changed payload that was executed or answered with the original response', () => {
    const h = history()
    const row = payment('i1', 1)
    const probeRow = payment('p1', 1, { amount: 999 })
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    h.invoke(
      'p1',
      { amount: 999, currency: 'eur', reference: 'p1' },
      { key: 'k-i1', kind: 'changed-payload', of: 'i1' },
    )
    h.settle('p1', 'ok', created(probeRow), 'k-i1')
    const result = check(h.events, ledger([row, probeRow]))
    expect(rules(result)).toEqual(
      expect.arrayContaining(['effect-after-failure', 'payload-mismatch-accepted']),
    )
    expect(result.classes.p1).toBe('unexpected')
  })

  it('reports a changed payload silently answered with the stored response (the client believes 999 was paid)', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    h.invoke(
      'p1',
      { amount: 999, currency: 'eur', reference: 'p1' },
      { key: 'k-i1', kind: 'changed-payload', of: 'i1' },
    )
    h.settle('p1', 'ok', created(row), 'k-i1')
    const result = check(h.events, ledger([row]))
    expect(rules(result)).toEqual(['lost-acknowledged', 'payload-mismatch-accepted'])
    expect(result.classes.p1).toBe('lost')
  })

  it('reports an effect for an intent that was settled as a definite failure', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'fail', { status: 402, body: { type: 'card_declined' } })
    const db = ledger([row])
    db.keys = []
    const result = check(h.events, db)
    expect(rules(result)).toEqual(['effect-after-failure'])
    expect(result.classes.i1).toBe('unexpected')
  })

  it('reports payments, charges and outbox rows nobody asked for', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    const stray = payment('ghost', 1)
    const db = ledger([row, stray])
    db.outbox.push({ id: 'ob_orphan', paymentId: 'pay_missing' })
    const result = check(h.events, db)
    const strays = result.violations.filter((v) => v.rule === 'effect-without-intent')
    expect(strays.map((v) => v.message).sort()).toEqual([
      'charge nobody asked for',
      'outbox row for no payment',
      'payment nobody asked for',
    ])
  })

  it('reports a payment whose amount differs from the request', () => {
    const h = history()
    const row = payment('i1', 1, { amount: 101 })
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    expect(rules(check(h.events, ledger([row])))).toEqual(['effect-differs-from-request'])
  })

  it('reports a payment without its outbox row, or with two', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    expect(rules(check(h.events, { ...ledger([row]), outbox: [] }))).toEqual(['outbox-mismatch'])
    const twice = ledger([row])
    twice.outbox.push({ id: 'ob_again', paymentId: row.id })
    expect(rules(check(h.events, twice))).toEqual(['outbox-mismatch'])
  })

  it('reports intents still pending after the drain and keys left in progress, with the lines', () => {
    const h = history()
    const invoke = h.invoke('i1', body('i1'))
    h.attempt('i1', 1)
    const drain = h.drain(['i1'])
    const db = ledger([], {
      keys: [{ tenantId: 't1', key: 'k-i1', state: 'in_progress', responseStatus: null, responseBody: null }],
    })
    const result = check(h.events, db)
    expect(rules(result)).toEqual(['key-in-flight', 'unsettled-intent'])
    expect(result.violations.find((v) => v.rule === 'unsettled-intent')?.lines).toEqual(
      expect.arrayContaining([invoke, drain]),
    )
    expect(result.violations.find((v) => v.rule === 'key-in-flight')?.lines).toEqual([invoke])
  })

  it('judges settlement by each worker’s last drain report', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.drain(['i1'])
    h.settle('i1', 'ok', created(row))
    h.drain([])
    expect(check(h.events, ledger([row])).valid).toBe(true)
  })

  it('does not attribute another tenant’s payment with the same reference to an intent', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    const db = ledger([row])
    db.payments.push(payment('i1', 9, { tenantId: 't2' }))
    db.outbox.push({ id: 'ob_t2', paymentId: 'pay_i1_9' })
    const result = check(h.events, db)
    expect(rules(result)).toEqual(['effect-without-intent'])
    expect(result.classes.i1).toBe('ok')
  })

  it('is pure: the same inputs give the same verdict, and the inputs are not modified', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    const db = ledger([row, payment('i1', 2)])
    const before = JSON.stringify([h.events, db])
    expect(check(h.events, db)).toEqual(check(h.events, db))
    expect(JSON.stringify([h.events, db])).toBe(before)
  })
})

describe('check: failovers', () => {
  /**
   * i1 was acknowledged during an asynchronous failover and lost with its key; a replay after it ran again and
   * recorded payment 2 with the charge the provider kept (the provider is another system: its charge survived).
   */
  function lostThenRedone(replication: 'sync' | 'async', redoneCharge = 'ch_i1_1') {
    const h = history()
    const lost = payment('i1', 1)
    const redone = payment('i1', 2, { chargeId: redoneCharge })
    h.failover('start', replication)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(lost))
    h.failover('stop', replication)
    h.invoke('f1', body('i1'), { key: 'k-i1', kind: 'failover-replay', of: 'i1' })
    h.settle('f1', 'ok', created(redone), 'k-i1')
    const db = ledger([redone])
    if (redoneCharge !== lost.chargeId)
      db.charges.push({ id: lost.chargeId!, tenantId: 't1', amount: 100, currency: 'eur', reference: null })
    return { h, db, lost, redone }
  }

  it('classifies what an async failover lost as lost-in-failover, not a violation, and says what became of it', () => {
    const { h, db, lost, redone } = lostThenRedone('async')
    const result = check(h.events, db)
    expect(result.violations).toEqual([])
    expect(result.classes.i1).toBe('lost-in-failover')
    expect(result.counts['lost-in-failover']).toBe(1)
    expect(result.lostInFailover).toEqual([
      {
        intent: 'i1',
        key: 'k-i1',
        payment: lost.id,
        chargeId: lost.chargeId,
        redone: { payment: redone.id, chargeId: lost.chargeId },
      },
    ])
  })

  it('reports the same loss under sync replication: nothing acknowledged may be lost there', () => {
    const { h, db } = lostThenRedone('sync')
    expect(rules(check(h.events, db))).toEqual(
      expect.arrayContaining(['ack-differs-from-effect', 'ack-differs-from-stored', 'acks-disagree']),
    )
  })

  it('reports a retry after the failover that charged again (a step key that was not deterministic)', () => {
    const { h, db } = lostThenRedone('async', 'ch_new')
    const result = check(h.events, db)
    expect(rules(result)).toEqual(['duplicate-charge'])
  })

  it('reports a replay, after the failover, of a payment the failover lost (a key kept without its effect)', () => {
    const h = history()
    const lost = payment('i1', 1)
    h.failover('start', 'async')
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(lost))
    h.failover('stop', 'async')
    h.invoke('f1', body('i1'), { key: 'k-i1', kind: 'failover-replay', of: 'i1' })
    h.settle('f1', 'ok', created(lost), 'k-i1')
    const db = lostInFailover(lost)
    const result = check(h.events, db)
    expect(rules(result)).toEqual(['replayed-lost-effect'])
    expect(result.classes.i1).toBe('lost-in-failover')
  })

  /**
   * A worker killed between receiving an answer and reporting it reports it from its store when it restarts, maybe
   * long after a failover that lost the payment. The report is the answer received during the failover, not a replay
   * after it: its receivedAt (when the worker stored it) decides, not the time of the report.
   */
  function reportedAfterRestart(receivedDuringFailover: boolean) {
    const h = history()
    const lost = payment('i1', 1)
    const start = h.failover('start', 'async')
    h.invoke('i1', body('i1'))
    const stop = h.failover('stop', 'async')
    const startTime = h.events[start - 1]!.time
    const stopTime = h.events[stop - 1]!.time
    h.settle('i1', 'ok', created(lost), 'k-i1', receivedDuringFailover ? startTime + 1 : stopTime + 1)
    const db = lostInFailover(lost)
    return check(h.events, db)
  }

  it('judges an outcome a restarted worker reports from its store by when it was received', () => {
    const during = reportedAfterRestart(true)
    expect(during.violations).toEqual([])
    expect(during.classes.i1).toBe('lost-in-failover')
    // Received after the failover ended: an acknowledged payment that is gone, as if the report were on time.
    expect(rules(reportedAfterRestart(false))).toContain('lost-acknowledged')
  })

  /** An attempt sent at `sentAt` (worker clock) whose 201 for a payment the failover lost arrives after the failover. */
  function answeredAfterFailover(sentDuringFailover: boolean) {
    const h = history()
    const lost = payment('i1', 1)
    h.invoke('i1', body('i1'))
    const start = h.failover('start', 'async')
    const stop = h.failover('stop', 'async')
    const stopTime = h.events[stop - 1]!.time
    const sentAt = sentDuringFailover ? h.events[start - 1]!.time : stopTime + 1
    h.add({
      type: 'attempt',
      phase: 'invoke',
      process: 'worker-1',
      intent: 'i1',
      key: 'k-i1',
      attempt: 1,
      sentAt,
    })
    h.settle('i1', 'ok', created(lost), 'k-i1', stopTime + 5_000)
    const db = lostInFailover(lost)
    return check(h.events, db)
  }

  it('judges an answer by when its request was sent: one sent during the failover may be lost with it', () => {
    const sentDuring = answeredAfterFailover(true)
    expect(sentDuring.violations).toEqual([])
    expect(sentDuring.classes.i1).toBe('lost-in-failover')
    expect(rules(answeredAfterFailover(false))).toContain('lost-acknowledged')
  })

  it('excuses a loss from when the nemesis measured the standby was behind, even before the failover began', () => {
    const h = history()
    const lost = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(lost))
    const early = h.events.map((e) => ({ ...e, time: e.time - 10_000 }))
    const start = h.failover('start', 'async')
    const stop = h.add({
      type: 'fault',
      fault: 'failover',
      target: 'postgres',
      phase: 'stop',
      process: 'nemesis',
      detail: { replication: 'async', lostSince: early[0]!.time - 1 },
    })
    const events = [...early, ...h.events.slice(start - 1, stop)]
    const result = check(events, ledger([]))
    expect(result.violations).toEqual([])
    expect(result.classes.i1).toBe('lost-in-failover')
    // Without the measurement, the same loss 10 s before the failover is a violation.
    const unmeasured = events.map((e) =>
      e.type === 'fault' ? { ...e, detail: { replication: 'async' } } : e,
    )
    expect(rules(check(unmeasured, ledger([])))).toEqual(['lost-acknowledged'])
  })

  it('reports a key that stores a response for a payment the ledger does not hold', () => {
    const h = history()
    const row = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(row))
    const db = ledger([row])
    db.keys.push({
      tenantId: 't1',
      key: 'k-gone',
      state: 'succeeded',
      responseStatus: 201,
      responseBody: { id: 'pay_gone' },
    })
    expect(rules(check(h.events, db))).toEqual(['stored-response-without-effect'])
  })

  it('does not excuse a loss long before the failover began', () => {
    const h = history()
    const lost = payment('i1', 1)
    h.invoke('i1', body('i1'))
    h.settle('i1', 'ok', created(lost))
    const events = h.events.map((e) => ({ ...e, time: e.time - 60_000 }))
    const start = h.failover('start', 'async')
    h.failover('stop', 'async')
    const result = check([...events, ...h.events.slice(start - 1)], ledger([]))
    expect(rules(result)).toEqual(['lost-acknowledged'])
  })
})
