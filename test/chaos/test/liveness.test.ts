import { describe, expect, it } from 'vitest'
import { check, type FinalDb } from '../src/checker.js'
import type { HistoryEvent, NewEvent } from '../src/history.js'
import { checkLiveness, OUTAGE_GRACE_MS } from '../src/liveness.js'

const BOUND = 30_000
const T0 = 1_000_000

/** A history built by hand, each event at the time given (ms after T0). */
function history() {
  const events: HistoryEvent[] = []
  const add = (at: number, event: NewEvent) => {
    events.push({ ...event, index: events.length + 1, time: T0 + at } as HistoryEvent)
  }
  return {
    events,
    /** One attempt of a burst intent sent at `sent`, ended at `end` (answered, the connection ended, or given up). */
    attempt(intent: string, sent: number, end: number, how: 'answered' | 'ended' | 'given-up' | 'none') {
      const key = `saturation-${intent}`
      add(sent, {
        type: 'attempt',
        phase: 'invoke',
        process: 'nemesis',
        intent,
        key,
        attempt: 1,
        sentAt: T0 + sent,
        target: 'api-1',
        boundMs: BOUND,
      })
      if (how === 'none') return
      const base = { process: 'nemesis', intent, key, attempt: 1 } as const
      if (how === 'answered')
        add(end, {
          type: 'attempt',
          phase: 'ok',
          ...base,
          receivedAt: T0 + end,
          response: { status: 201, body: {} },
        })
      else if (how === 'ended')
        add(end, { type: 'attempt', phase: 'info', ...base, receivedAt: T0 + end, error: 'connection reset' })
      else add(end, { type: 'attempt', phase: 'info', ...base, error: 'no answer within 45000 ms, given up' })
    },
    health(sent: number, end: number, answered = true) {
      add(end, {
        type: 'health',
        phase: answered ? 'ok' : 'info',
        process: 'liveness',
        target: 'api-2',
        pid: 42,
        sentAt: T0 + sent,
        boundMs: BOUND,
        ...(answered ? { receivedAt: T0 + end, status: 200 } : { error: 'still waiting when the run ended' }),
      })
    },
    outage(fault: 'restart-db' | 'failover', from: number, until: number) {
      add(from, { type: 'fault', process: 'nemesis', fault, target: 'postgres', phase: 'start' })
      add(until, { type: 'fault', process: 'nemesis', fault, target: 'postgres', phase: 'stop' })
    },
    tick(at: number) {
      add(at, { type: 'process', process: 'driver', action: 'ready' })
    },
  }
}

describe('checkLiveness', () => {
  it('passes requests and health probes answered within their bound, a broken connection counting as an end', () => {
    const h = history()
    h.attempt('s001-001', 0, 3_000, 'answered')
    h.attempt('s001-002', 0, 29_000, 'ended')
    h.health(0, 1_000)
    const { violations, summary } = checkLiveness(h.events)
    expect(violations).toEqual([])
    expect(summary).toMatchObject({
      requests: 2,
      unansweredRequests: 0,
      healthProbes: 1,
      unansweredHealth: 0,
    })
    expect(summary.slowestRequest).toMatchObject({ ms: 29_000, answered: true })
  })

  it('reports each request not answered within its bound: which one, to which instance, and for how long', () => {
    const h = history()
    h.attempt('s001-001', 0, 45_000, 'given-up')
    h.attempt('s001-002', 1_000, 40_000, 'answered')
    h.attempt('s001-003', 2_000, 0, 'none')
    h.tick(62_000)
    const { violations, summary } = checkLiveness(h.events)
    expect(violations.map((v) => [v.rule, v.intent, v.message])).toEqual([
      [
        'unanswered-request',
        's001-001',
        'POST /v1/payments (intent s001-001, attempt 1) to api-1 unanswered for 45.0 s (bound 30.0 s): no answer within 45000 ms, given up',
      ],
      [
        'unanswered-request',
        's001-002',
        'POST /v1/payments (intent s001-002, attempt 1) to api-1 unanswered for 39.0 s (bound 30.0 s): answered 201 then',
      ],
      [
        'unanswered-request',
        's001-003',
        'POST /v1/payments (intent s001-003, attempt 1) to api-1 unanswered for 60.0 s (bound 30.0 s): no end recorded',
      ],
    ])
    expect(violations[0]!.lines).toEqual([1, 2])
    expect(summary.unansweredRequests).toBe(3)
  })

  it('reports a health probe still waiting when the run ended, by when the monitor gave up', () => {
    const h = history()
    h.health(0, 50_000, false)
    const { violations } = checkLiveness(h.events)
    expect(violations).toHaveLength(1)
    expect(violations[0]).toMatchObject({
      rule: 'unanswered-health',
      message:
        'GET /healthz to api-2 (pid 42) unanswered for 50.0 s (bound 30.0 s): still waiting when the run ended',
    })
  })

  it('counts the bound from the end of a database outage the request overlapped, and still catches a hang after it', () => {
    const h = history()
    h.outage('restart-db', 0, 20_000)
    // In flight through the outage, answered 10 s after it: fine, though it waited 35 s.
    h.attempt('s001-001', 5_000, 20_000 + OUTAGE_GRACE_MS + 10_000, 'answered')
    // Sent just after the outage, then hung: 40 s past the grace.
    h.health(21_000, 20_000 + OUTAGE_GRACE_MS + 40_000, false)
    const { violations, summary } = checkLiveness(h.events)
    expect(violations.map((v) => v.rule)).toEqual(['unanswered-health'])
    expect(violations[0]!.message).toMatch(
      /unanswered for 44\.0 s, 40\.0 s of it once a database outage was over/,
    )
    expect(summary.overlappedOutage).toBe(2)
  })

  it('makes check() fail with the liveness violations next to the safety ones', () => {
    const h = history()
    h.health(0, 31_000)
    const empty: FinalDb = { payments: [], charges: [], keys: [], outbox: [] }
    const result = check(h.events, empty)
    expect(result.valid).toBe(false)
    expect(result.violations.map((v) => v.rule)).toEqual(['unanswered-health'])
    expect(result.liveness.unansweredHealth).toBe(1)
  })
})
