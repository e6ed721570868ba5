// What the two reservation protocols do differently, and that both can share one table (during a switch from one
// to the other) because each fences against the other's writes. Everything they share is engine.test.ts, which
// runs under each.
import type { TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createEngine, type ExecuteInput, type ExecutionContext, postgresStore } from '../src/index.js'
import {
  engineFor,
  freshKey,
  gate,
  keyRecord,
  pay,
  paymentsFor,
  payRequest,
  running,
  setupDatabase,
  sleep,
  stallEventLoop,
} from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('protocols')
})
afterAll(() => db.drop())

type Options = Parameters<typeof engineFor>[1]
const rowEngine = (options: Options = {}) => engineFor(db.pool, { reservation: 'row', ...options })
const lockEngine = (options: Options = {}) => engineFor(db.pool, { reservation: 'lock', ...options })

const input = (key: string, extra: Partial<ExecuteInput> = {}) => payRequest('protocols', key, extra)

const record = (key: string) => keyRecord(db.pool, key)

describe("reservation: 'row'", () => {
  it('commits an in_progress row under a lease measured on the database clock before the handler runs', async () => {
    const { engine } = rowEngine({ leaseMs: 7_000 })
    const key = freshKey()
    const { opened, open } = gate()
    const held = running(async () => {
      await opened
      return { status: 200 }
    })
    const attempt = engine.execute(input(key, { handler: held.handler }))
    await held.started
    const { rows } = await db.pool.query(
      `SELECT status, lock_token, extract(epoch FROM locked_until - updated_at) * 1000 AS lease
       FROM oncely.idempotency_keys WHERE key = $1`,
      [key],
    )
    expect(rows[0].status).toBe('in_progress')
    expect(Number(rows[0].lease)).toBe(7_000)
    expect(rows[0].lock_token).toMatch(/^[0-9a-f-]{36}$/)
    open()
    await attempt
  })

  it('with unsafe.disableFencing a paused attempt commits after its takeover (so a checker can see duplicates)', async () => {
    const key = freshKey()
    const paused = gate()
    const reachedCommit = gate()
    const unsafe = rowEngine({
      leaseMs: 200,
      unsafe: { disableFencing: true },
      hooks: {
        beforeCommit: async () => {
          reachedCommit.open()
          await paused.opened
        },
      },
    })
    const original = unsafe.engine.execute(input(key, { handler: pay(key) }))
    await reachedCommit.opened
    await sleep(250)
    // Its own lease has no part in the takeover (the original's row decides): the default, which no stall outlasts.
    await rowEngine().engine.execute(input(key, { handler: pay(key) }))
    paused.open()
    expect((await original).kind).toBe('executed')
    expect(await paymentsFor(db.pool, key)).toBe(2)
  })
})

describe("reservation: 'lock'", () => {
  it('writes nothing for the key until the commit, then the finished record with the business write', async () => {
    const { engine, events } = lockEngine({ replayCache: false })
    const key = freshKey()
    let during: unknown = 'not read'
    const first = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          during = await record(key)
          return pay(key)(ctx)
        },
      }),
    )
    expect(during).toBeUndefined()
    expect(first).toMatchObject({ kind: 'executed', status: 'succeeded', attempt: 1 })
    expect(await record(key)).toMatchObject({
      status: 'succeeded',
      attempts: 1,
      response_status: 201,
      lock_token: null,
    })
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'replayed', fencedOut: false })
    expect(events.map((e) => e.type)).toEqual(['reserved', 'executed', 'replayed'])
  })

  it('writes a leased row on the first recovery point, so a crash after it is taken over like in the row protocol', async () => {
    // A lease of two seconds: the duplicate below must still find it held after a rollback and a read on a loaded
    // machine (a second left little margin).
    const crash = new Error('simulated crash before the commit')
    const { engine: crashing } = lockEngine({
      leaseMs: 2_000,
      retentionMs: 60_000,
      hooks: {
        beforeCommit: () => {
          throw crash
        },
      },
    })
    const key = freshKey()
    const charged = async (ctx: ExecutionContext) => {
      expect(await ctx.saveRecoveryPoint('charged')).toBe(true)
      return pay(key)(ctx)
    }
    await expect(crashing.execute(input(key, { handler: charged }))).rejects.toBe(crash)
    const saved = await record(key)
    expect(saved).toMatchObject({ status: 'in_progress', recovery_point: 'charged', attempts: 1 })
    expect(saved.lock_token).not.toBeNull()

    const { engine, events } = lockEngine({ leaseMs: 2_000, retentionMs: 60_000 })
    const duplicate = await engine.execute(input(key))
    expect(duplicate).toMatchObject({ kind: 'in_progress' })
    // At most what is left of the lease: it has run out by then, so a retry then may take over.
    if (duplicate.kind === 'in_progress') expect(duplicate.retryAfterMs).toBeLessThanOrEqual(2_000)
    await sleep(2_050)
    let seenPoint: string | null = null
    const takeover = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          seenPoint = ctx.recoveryPoint
          return pay(key)(ctx)
        },
      }),
    )
    expect(takeover).toMatchObject({ kind: 'executed', attempt: 2 })
    expect(seenPoint).toBe('charged')
    expect(events.some((e) => e.type === 'takeover')).toBe(true)
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it('releases its recovery-point row after a retryable failure, and stores a permanent one on it', async () => {
    const { engine } = lockEngine({ replayCache: false })
    const key = freshKey()
    const retry = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          await ctx.saveRecoveryPoint('one')
          throw new Error('downstream timeout')
        },
      }),
    )
    expect(retry).toMatchObject({ kind: 'retryable_failure' })
    expect(await record(key)).toMatchObject({ status: 'failed_retryable', recovery_point: 'one' })
    const declined = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          expect(ctx.recoveryPoint).toBe('one')
          await ctx.saveRecoveryPoint('two')
          throw Object.assign(new Error('card declined'), { statusCode: 402 })
        },
      }),
    )
    expect(declined).toMatchObject({ kind: 'executed', status: 'failed_permanent', attempt: 2 })
    expect(await record(key)).toMatchObject({ status: 'failed_permanent', attempts: 2, lock_token: null })
  })

  it('checks the option', () => {
    expect(() =>
      createEngine({ store: postgresStore({ pool: db.pool }), reservation: 'locks' as never }),
    ).toThrow(/`reservation` to be 'row' or 'lock', got "locks"/)
  })
})

describe('both protocols on one table', () => {
  it('the lock protocol takes over an abandoned row-protocol reservation, and fences the late original', async () => {
    const { opened, open } = gate()
    const reached = gate()
    const asked = gate()
    // A lease of a second: renewed every third of it, it stays held through a loaded machine's stalls until the
    // original stalls past it on purpose.
    const { engine: original } = rowEngine({ leaseMs: 1_000, retentionMs: 60_000 })
    const key = freshKey()
    const late = original.execute(
      input(key, {
        handler: async (ctx) => {
          await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 7)', [
            ctx.scope,
            key,
          ])
          reached.open()
          await asked.opened
          // The original's process stalls past its lease (a live one would renew it), then goes on waiting.
          stallEventLoop(1_100)
          await opened
          return { status: 201, body: { by: 'original' } }
        },
      }),
    )
    await reached.opened
    const { engine } = lockEngine()
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'in_progress' })
    asked.open()
    await sleep(50)
    // It waits out the lease, however late the original's last renewal landed.
    const takeover = await engine.execute(
      input(key, { handler: pay(key, { by: 'takeover' }), wait: { timeoutMs: 5_000 } }),
    )
    expect(takeover).toMatchObject({ kind: 'executed', attempt: 2 })
    open()
    const answer = await late
    expect(answer).toMatchObject({ kind: 'replayed', fencedOut: true })
    if (answer.kind === 'replayed')
      expect(JSON.parse(answer.response.body.toString())).toEqual({ by: 'takeover' })
    const { rows } = await db.pool.query('SELECT amount FROM payments WHERE cart = $1', [key])
    expect(rows.map((r) => r.amount)).toEqual([100])
  })

  it('a lock-protocol attempt is fenced out by a row-protocol reservation made while it ran', async () => {
    const { opened, open } = gate()
    const reached = gate()
    const { engine, events } = lockEngine()
    const key = freshKey()
    const locked = engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key, { by: 'lock' })(ctx)
          reached.open()
          await opened
          return { status: 201, body: { by: 'lock' } }
        },
      }),
    )
    await reached.opened
    // The row protocol does not take the advisory lock: it reserves and completes on its own.
    expect(await rowEngine().engine.execute(input(key, { handler: pay(key, { by: 'row' }) }))).toMatchObject({
      kind: 'executed',
    })
    open()
    const outcome = await locked
    expect(outcome).toMatchObject({ kind: 'replayed', fencedOut: true })
    if (outcome.kind === 'replayed')
      expect(JSON.parse(outcome.response.body.toString())).toEqual({ by: 'row' })
    expect(events.some((e) => e.type === 'fenced_out')).toBe(true)
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it('a lock-protocol attempt whose INSERT meets a row-protocol reservation still running is fenced out', async () => {
    // The lock attempt found no row, so it finishes with a plain INSERT: the unique violation is the fence.
    const lockReached = gate()
    const rowReserved = gate()
    const rowMayFinish = gate()
    const { engine, events } = lockEngine()
    const key = freshKey()
    const locked = engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key, { by: 'lock' })(ctx)
          lockReached.open()
          await rowReserved.opened
          return { status: 201, body: { by: 'lock' } }
        },
      }),
    )
    await lockReached.opened
    const row = rowEngine().engine.execute(
      input(key, {
        handler: async (ctx) => {
          rowReserved.open()
          await rowMayFinish.opened
          return pay(key, { by: 'row' })(ctx)
        },
      }),
    )
    const outcome = await locked
    // Not a 500, not an execution: the key is another attempt's, still running.
    expect(outcome.kind).toBe('lease_expired')
    expect(events.filter((e) => e.type === 'fenced_out')).toHaveLength(1)
    expect(await paymentsFor(db.pool, key)).toBe(0)
    rowMayFinish.open()
    expect(await row).toMatchObject({ kind: 'executed', attempt: 1 })
    expect(await paymentsFor(db.pool, key)).toBe(1)
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'replayed' })
  })

  it("a lock-protocol attempt's permanent failure meeting a row-protocol record is fenced out too", async () => {
    const reached = gate()
    const { opened, open } = gate()
    const { engine } = lockEngine()
    const key = freshKey()
    const locked = engine.execute(
      input(key, {
        handler: async () => {
          reached.open()
          await opened
          throw Object.assign(new Error('refused'), { statusCode: 400 })
        },
      }),
    )
    await reached.opened
    expect(await rowEngine().engine.execute(input(key, { handler: pay(key, { by: 'row' }) }))).toMatchObject({
      kind: 'executed',
    })
    open()
    const outcome = await locked
    expect(outcome).toMatchObject({ kind: 'replayed', fencedOut: true })
    if (outcome.kind === 'replayed')
      expect(JSON.parse(outcome.response.body.toString())).toEqual({ by: 'row' })
    expect(await record(key)).toMatchObject({ status: 'succeeded', response_status: 201 })
  })

  it('a unique violation of a business constraint at COMMIT is a store failure, not a fence', async () => {
    await db.pool.query(
      `CREATE TABLE IF NOT EXISTS deferred_carts (cart text UNIQUE DEFERRABLE INITIALLY DEFERRED)`,
    )
    const { engine } = lockEngine()
    const key = freshKey()
    const outcome = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          await ctx.tx.query('INSERT INTO deferred_carts VALUES ($1), ($1)', [key])
          return { status: 201, body: {} }
        },
      }),
    )
    expect(outcome.kind).toBe('unavailable')
    expect(await record(key)).toBeUndefined()
    // Nothing committed, so the next attempt runs.
    expect(await engine.execute(input(key, { handler: pay(key) }))).toMatchObject({ kind: 'executed' })
  })

  it('with unsafe.disableFencing, the same race commits twice (the fence is what prevents it)', async () => {
    const { opened, open } = gate()
    const reached = gate()
    const { engine } = lockEngine({ unsafe: { disableFencing: true } })
    const key = freshKey()
    const locked = engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key)(ctx)
          reached.open()
          await opened
          return { status: 201, body: { by: 'lock' } }
        },
      }),
    )
    await reached.opened
    await rowEngine().engine.execute(input(key))
    open()
    expect(await locked).toMatchObject({ kind: 'executed' })
    expect(await paymentsFor(db.pool, key)).toBe(2)
  })
})
