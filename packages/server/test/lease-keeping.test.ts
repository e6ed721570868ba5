// A live process keeps its lease; only a stopped one loses it (test/lease.test.ts stops a real one with SIGSTOP).
// Regression: Postgres ended the transaction of a handler that awaited a provider for longer than `leaseMs` (the
// lease guard saw it idle), so every retry did the work again, rolled back and was answered 409 for its own
// request. And a duplicate's `Retry-After` estimates when the holder will be done, under both protocols.
import type { TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { ExecutionContext, Outcome } from '../src/index.js'
import {
  engineFor,
  freshKey,
  gate,
  pay,
  paymentsFor,
  payRequest,
  reservation,
  setupDatabase,
  sleep,
} from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('lease_keeping')
})
afterAll(() => db.drop())

// Two seconds: the process loses its key, as it must, once its keep-alive (every third of the lease) runs a whole
// lease late, and on a machine running two suites at once a timer ran more than 700 ms late.
const LEASE_MS = 2_000

describe(`a live handler keeps its key (reservation: '${reservation}')`, () => {
  it.each([
    ['waiting on a provider', false],
    ['waiting on a provider after saving a recovery point', true],
  ])('completes once when %s for twice the lease; duplicates meanwhile get 409', async (_, withPoint) => {
    const { engine } = engineFor(db.pool, { leaseMs: LEASE_MS, replayCache: false })
    const key = freshKey()
    let runs = 0
    let asked!: () => void
    const duplicatesAsked = new Promise<void>((resolve) => {
      asked = resolve
    })
    const slow = async (ctx: ExecutionContext) => {
      runs++
      if (withPoint) expect(await ctx.saveRecoveryPoint('charged')).toBe(true)
      // Idle in its transaction, alive, for twice the lease at least (and until every duplicate asked).
      await Promise.all([sleep(2 * LEASE_MS + 200), duplicatesAsked])
      return pay(key)(ctx)
    }
    const first = engine.execute(payRequest('live', key, { handler: slow }))
    // A duplicate that runs (it should not) pays at once: with the slow handler it would wait for every duplicate to
    // have asked, its own answer included, and the test would hang instead of failing.
    const paying = async (ctx: ExecutionContext) => {
      runs++
      return pay(key)(ctx)
    }
    const duplicates: Outcome[] = []
    for (let i = 0; i < 5; i++) {
      await sleep(LEASE_MS / 2)
      duplicates.push(await engine.execute(payRequest('live', key, { handler: paying })))
    }
    asked()
    expect(await first).toMatchObject({ kind: 'executed', status: 'succeeded' })
    expect(duplicates.map((d) => d.kind)).toEqual(Array(5).fill('in_progress'))
    expect(runs).toBe(1)
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })
})

describe(`Retry-After of a 409 (reservation: '${reservation}')`, () => {
  /** Starts an execution of `key` that holds it until `release` is called, and resolves once it holds it. */
  async function holding(
    engine: ReturnType<typeof engineFor>['engine'],
    key: string,
    work: () => Promise<void>,
  ) {
    let held!: () => void
    const holds = new Promise<void>((resolve) => {
      held = resolve
    })
    const done = engine.execute(
      payRequest('eta', key, {
        handler: async (ctx) => {
          held()
          await work()
          return pay(key)(ctx)
        },
      }),
    )
    await holds
    return { done } // not `done` itself: an async function would wait for it
  }
  const retryAfterOf = (outcome: Outcome) =>
    outcome.kind === 'in_progress' ? outcome.retryAfterMs : Number.NaN

  it('is about as long again as the holder has run, for an operation not seen finishing yet', async () => {
    const { engine } = engineFor(db.pool, { leaseMs: 20_000 })
    const key = freshKey()
    const { done: first } = await holding(engine, key, () => sleep(3_500))
    await sleep(2_500)
    const duplicate = await engine.execute(payRequest('eta', key))
    expect(duplicate).toMatchObject({ kind: 'in_progress' })
    const retryAfter = retryAfterOf(duplicate)
    // The holder has run about 2.5 s: it is likely to run about as long again (bounded by the lease left).
    expect(retryAfter).toBeGreaterThanOrEqual(2_000)
    expect(retryAfter).toBeLessThanOrEqual(20_000)
    expect(await first).toMatchObject({ kind: 'executed' })
  })

  it("is the holder's typical remaining time once its operation was seen finishing", async () => {
    const { engine } = engineFor(db.pool, { leaseMs: 20_000 })
    const learned = freshKey()
    const learning = Date.now()
    expect(await (await holding(engine, learned, () => sleep(4_000))).done).toMatchObject({
      kind: 'executed',
    })
    // At least 4 s, and on a loaded machine some more: what the engine learned is no longer than this.
    const learnedMs = Date.now() - learning
    const key = freshKey()
    const called = Date.now()
    const { done: first } = await holding(engine, key, () => sleep(4_000))
    await sleep(500)
    const retryAfter = retryAfterOf(await engine.execute(payRequest('eta', key)))
    // The holder had run no longer than this when the duplicate asked (about 0.5 s, more on a loaded machine).
    const ranAtMostMs = Date.now() - called
    // Typically 4 s, and it has run about 0.5 s: ask again in about 3.5 s, not in 1 s, nor after the lease. The
    // bounds follow what this run measured, not what a quiet machine would.
    expect(retryAfter).toBeGreaterThanOrEqual(Math.max(1_000, 4_000 - ranAtMostMs - 50))
    expect(retryAfter).toBeLessThanOrEqual(learnedMs)
    expect(await first).toMatchObject({ kind: 'executed' })
  })

  it('is a second for a holder that typically ends at once, recovery point or not', async () => {
    const { engine } = engineFor(db.pool, { leaseMs: 20_000 })
    const quick = freshKey()
    const quickFrom = Date.now()
    expect(await (await holding(engine, quick, async () => {})).done).toMatchObject({ kind: 'executed' })
    const quickMs = Date.now() - quickFrom
    const key = freshKey()
    let release!: () => void
    const released = new Promise<void>((resolve) => {
      release = resolve
    })
    const charged = gate()
    const called = Date.now()
    const first = engine.execute(
      payRequest('eta', key, {
        handler: async (ctx) => {
          await ctx.saveRecoveryPoint('charged') // a row with the whole lease left: not what the 409 says
          charged.open()
          await released
          return pay(key)(ctx)
        },
      }),
    )
    await charged.opened // it holds the key, and its recovery point is saved
    // A second; more only when this machine made the quick run, or the wait since the recovery point, longer than
    // that. Never the recovery point's whole lease.
    const retryAfter = retryAfterOf(await engine.execute(payRequest('eta', key)))
    expect(retryAfter).toBeGreaterThanOrEqual(1_000)
    expect(retryAfter).toBeLessThanOrEqual(Math.max(1_000, quickMs, Date.now() - called) + 1)
    release()
    expect(await first).toMatchObject({ kind: 'executed' })
  })
})
