// An attempt holds one connection of the pool from its reservation to its answer, and never waits for a second one
// meanwhile. Regression: a thrown 4xx (the declined payment), a released key, a lost lease or a recovery point each
// asked the same pool for another connection while holding one, so pool-size such attempts at once waited for each
// other forever (pg's connectionTimeoutMillis is 0 by default) and nothing answered again. Each failure path here
// runs 20 attempts at once on a pool of 5; every one must be answered, and the engine must go on serving.
import { type TestDatabase, waitFor } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest'
import { type ExecuteInput, postgresStore } from '../src/index.js'
import { createEngineForTesting, type TestingEngineOptions } from '../src/testing/index.js'
import {
  fingerprintOf,
  freshKey,
  pay,
  pooled,
  reservation,
  setupDatabase,
  sleep,
  stallEventLoop,
} from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('pool_exhaustion')
})
afterAll(() => db.drop())

const POOL_SIZE = 5
const ATTEMPTS = 20
/** Far more than 20 attempts need on a loaded machine, far less than forever. */
const ANSWERED_WITHIN_MS = 30_000

/** An engine on its own pool of 5, as a small service would size it. */
function smallEngine(options: Partial<TestingEngineOptions> = {}) {
  const pool = new pg.Pool({ connectionString: db.url, max: POOL_SIZE })
  pool.on('error', () => {})
  onTestFinished(() => pool.end())
  const engine = createEngineForTesting({
    store: postgresStore({ pool, preparedStatements: !pooled }),
    reservation,
    replayCache: false,
    ...options,
  })
  return { pool, engine }
}

const request = (key: string, handler: ExecuteInput['handler']): ExecuteInput => ({
  scope: 'tenant',
  operation: 'POST /v1/payments',
  key,
  fingerprint: fingerprintOf({ key }),
  handler,
})

/** Runs `ATTEMPTS` executions at once and resolves with their outcomes, or rejects if any is still unanswered. */
async function allAnswered(
  engine: ReturnType<typeof smallEngine>['engine'],
  handler: ExecuteInput['handler'],
) {
  const keys = Array.from({ length: ATTEMPTS }, () => freshKey('burst'))
  const outcomes = Promise.all(keys.map((key) => engine.execute(request(key, handler))))
  let timer: ReturnType<typeof setTimeout> | undefined
  const hung = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`not every attempt was answered within ${ANSWERED_WITHIN_MS} ms`)),
      ANSWERED_WITHIN_MS,
    )
  })
  try {
    return { keys, outcomes: await Promise.race([outcomes, hung]) }
  } finally {
    clearTimeout(timer)
  }
}

/** The engine still serves a fresh key, and every connection of its pool is back. */
async function stillServing({ pool, engine }: ReturnType<typeof smallEngine>) {
  const key = freshKey('after')
  expect(await engine.execute(request(key, pay(key)))).toMatchObject({ kind: 'executed' })
  // A connection goes back once its transaction ended, which may be after the answer: wait for that, not a fixed time.
  await waitFor(
    'every connection back in the pool',
    () => pool.waitingCount === 0 && pool.idleCount === pool.totalCount,
    5_000,
  )
  expect(pool.waitingCount).toBe(0)
  expect(pool.idleCount).toBe(pool.totalCount)
}

async function paymentsOf(keys: string[]): Promise<number> {
  const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = ANY($1)', [keys])
  return rows[0].n
}

describe(`20 attempts at once on a pool of 5 (reservation: '${reservation}')`, () => {
  it('a thrown 4xx (a declined payment): every failure stored and answered', async () => {
    const small = smallEngine()
    const { keys, outcomes } = await allAnswered(small.engine, async (ctx) => {
      await pay(ctx.key)(ctx)
      throw Object.assign(new Error('card declined'), { statusCode: 402 })
    })
    expect(outcomes.every((o) => o.kind === 'executed' && o.status === 'failed_permanent')).toBe(true)
    expect(await paymentsOf(keys)).toBe(0)
    await stillServing(small)
  })

  it('a thrown transient error and a 503: every key released and answered', async () => {
    const small = smallEngine()
    let n = 0
    const { outcomes } = await allAnswered(small.engine, async (ctx) => {
      await pay(ctx.key)(ctx)
      if (n++ % 2 === 0) throw new Error('provider timeout')
      return { status: 503, body: { retry: true } }
    })
    expect(outcomes.every((o) => o.kind === 'retryable_failure')).toBe(true)
    await stillServing(small)
  })

  it('a recovery point, then a failure: saved, released and answered', async () => {
    const small = smallEngine()
    const { keys, outcomes } = await allAnswered(small.engine, async (ctx) => {
      expect(await ctx.saveRecoveryPoint('charged')).toBe(true)
      if (ctx.key.length % 2 === 0) throw new Error('provider timeout')
      throw Object.assign(new Error('card declined'), { statusCode: 402 })
    })
    expect(outcomes.every((o) => o.kind === 'retryable_failure' || o.kind === 'executed')).toBe(true)
    const { rows } = await db.pool.query(
      'SELECT count(*)::int AS n FROM oncely.idempotency_keys WHERE key = ANY($1) AND recovery_point = $2',
      [keys, 'charged'],
    )
    expect(rows[0].n).toBe(ATTEMPTS)
    await stillServing(small)
  })

  it('a lost lease (the process stalled past it): every attempt answered lease_expired or with a record', async () => {
    const small = smallEngine({ leaseMs: 300 })
    let stalled = false
    const { keys, outcomes } = await allAnswered(small.engine, async (ctx) => {
      await pay(ctx.key)(ctx)
      if (!stalled) {
        // Once, while the first five hold their connections: every one of them sits idle past the lease.
        stalled = true
        await sleep(20)
        stallEventLoop(600)
      }
      return { status: 201, body: { ok: true } }
    })
    expect(outcomes.every((o) => o.kind === 'lease_expired' || o.kind === 'executed')).toBe(true)
    expect(outcomes.some((o) => o.kind === 'lease_expired')).toBe(true)
    const executed = outcomes.filter((o) => o.kind === 'executed').length
    expect(await paymentsOf(keys)).toBe(executed)
    await stillServing(small)
  })

  it.skipIf(pooled)('terminated backends (a restart or a failover): every attempt answered', async () => {
    const small = smallEngine()
    let terminated = false
    const { outcomes } = await allAnswered(small.engine, async (ctx) => {
      await pay(ctx.key)(ctx)
      if (!terminated) {
        terminated = true
        await sleep(20)
        await db.pool.query(
          `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
           WHERE datname = current_database() AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'`,
        )
      }
      await ctx.tx.query('SELECT 1')
      return { status: 201, body: { ok: true } }
    })
    expect(outcomes.length).toBe(ATTEMPTS)
    await stillServing(small)
  })
})
