import { migrate } from '@oncely/server'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { HistoryEvent, IntentKind, NewEvent } from '../src/history.js'
import { IntentTracker, type TrackedIntent } from '../src/in-flight.js'
import { keysInProgress, settle } from '../src/settle.js'

function tracked() {
  const tracker = new IntentTracker()
  let index = 0
  const feed = (event: NewEvent) => tracker.observe({ ...event, index: ++index, time: index } as HistoryEvent)
  return {
    tracker,
    invoke: (intent: string, kind: IntentKind) =>
      feed({
        type: 'intent',
        phase: 'invoke',
        process: 'worker-1',
        intent,
        tenant: 't1',
        key: `k-${intent}`,
        kind,
      }),
    attempt: (intent: string, attempt: number) =>
      feed({ type: 'attempt', phase: 'invoke', process: 'worker-1', intent, key: `k-${intent}`, attempt }),
    end: (intent: string, phase: 'ok' | 'fail' | 'info') =>
      feed({ type: 'intent', phase, process: 'worker-1', intent, tenant: 't1', key: `k-${intent}` }),
  }
}

describe('settle', () => {
  it('waits for a probe sent just before the end that is still retrying, before the ledger is read', async () => {
    const { tracker, invoke, end } = tracked()
    invoke('i00042', 'expired-replay')
    // Still answered 409 (a crashed attempt's reservation) when the drain is over; its answer comes a bit later.
    let answered = false
    setTimeout(() => {
      answered = true
      end('i00042', 'ok')
    }, 300)
    await settle({
      tracker,
      held: async () => new Set(),
      sendAgain: async () => {},
      log: () => {},
      pollMs: 10,
    })
    expect(answered).toBe(true)
  })

  it('sends again a probe that ended without an answer while its key is held, any such burst payment and expired changed payload', async () => {
    const { tracker, invoke, attempt, end } = tracked()
    invoke('i00007', 'changed-payload')
    attempt('i00007', 4)
    end('i00007', 'info')
    // Its key is not held: nothing is left for it to finish.
    invoke('i00008', 'reordered')
    end('i00008', 'info')
    // A payment nobody answered: its charge may have been taken.
    invoke('s001-003', 'saturation')
    attempt('s001-003', 1)
    end('s001-003', 'info')
    // Retried its whole budget on retryable answers: it must still end refused.
    invoke('i00009', 'expired-changed-payload')
    attempt('i00009', 9)
    end('i00009', 'info')
    const again: TrackedIntent[] = []
    const lines: string[] = []
    await settle({
      tracker,
      held: async () => new Set(['t1\u0000k-i00007']),
      sendAgain: async (intent) => {
        again.push({ ...intent })
        attempt(intent.id, intent.attempts + 1)
        setTimeout(() => end(intent.id, 'fail'), 50)
      },
      log: (line) => lines.push(line),
      pollMs: 10,
    })
    expect(again.map((i) => [i.id, i.attempts])).toEqual([
      ['i00007', 4],
      ['s001-003', 1],
      ['i00009', 9],
    ])
    expect(tracker.get('i00007')?.state).toBe('definite')
    expect(lines).toEqual(['sending again what ended without an answer: i00007, s001-003, i00009'])
  })
})

describe('keysInProgress', () => {
  let db: TestDatabase
  beforeAll(async () => {
    db = await createTestDatabase('chaos_settle')
    await migrate(db.pool, { schema: 'oncely' })
  })
  afterAll(() => db?.drop())

  it("reads the key table's rows in progress as scope and key, and only those", async () => {
    const insert = (scope: string, key: string, status: string) =>
      db.pool.query(
        `INSERT INTO oncely.idempotency_keys (scope, operation, key, fingerprint, status, expires_at)
         VALUES ($1, 'POST /v1/payments', $2, 'f', $3, now() + interval '1 hour')`,
        [scope, key, status],
      )
    await insert('tenant-1', 'k1', 'in_progress')
    await insert('tenant-2', 'k1', 'succeeded')
    await insert('tenant-burst', 'saturation-s001-001', 'in_progress')
    expect(await keysInProgress(db.pool)).toEqual(
      new Set(['tenant-1\u0000k1', 'tenant-burst\u0000saturation-s001-001']),
    )
  })
})
