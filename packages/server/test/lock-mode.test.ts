// reservation: 'lock': the advisory-lock protocol, against a real Postgres. The row protocol's contract suite is
// engine.test.ts; this file covers what the lock protocol does differently, and that both modes fence each other.
import type { TestDatabase } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createEngine, type ExecutionContext, type HandlerResponse, postgresStore } from '../src/index.js'
import { countPayments, engineFor, fingerprintOf, freshKey, setupDatabase, sleep } from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('lock_mode')
})
afterAll(() => db.drop())

const op = 'POST /v1/payments'
const lockEngine = (options: Parameters<typeof engineFor>[1] = {}) =>
  engineFor(db.pool, { reservation: 'lock', ...options })

function pay(cart: string, body: unknown = undefined) {
  return async (ctx: ExecutionContext): Promise<HandlerResponse> => {
    const { rows } = await ctx.tx.query(
      'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100) RETURNING id',
      [ctx.scope, cart],
    )
    return {
      status: 201,
      headers: { location: `/v1/payments/${rows[0].id}` },
      body: body ?? { id: rows[0].id },
    }
  }
}

function gate() {
  let open!: () => void
  const opened = new Promise<void>((resolve) => {
    open = resolve
  })
  return { opened, open }
}

const input = (
  key: string,
  extra: Partial<Parameters<ReturnType<typeof lockEngine>['engine']['execute']>[0]> = {},
) => ({
  scope: 'lock',
  operation: op,
  key,
  fingerprint: fingerprintOf({ key }),
  handler: pay(key),
  ...extra,
})

describe("reservation: 'lock'", () => {
  it('executes once, stores the finished record in the same commit, and replays it', async () => {
    const { engine, events } = lockEngine({ replayCache: false })
    const key = freshKey()
    const first = await engine.execute(input(key))
    expect(first).toMatchObject({ kind: 'executed', status: 'succeeded', attempt: 1 })
    const { rows } = await db.pool.query('SELECT * FROM oncely.idempotency_keys WHERE key = $1', [key])
    expect(rows[0]).toMatchObject({
      status: 'succeeded',
      attempts: 1,
      response_status: 201,
      lock_token: null,
    })
    expect(rows[0].expires_at.getTime() - rows[0].created_at.getTime()).toBe(86_400_000)
    const again = await engine.execute(input(key))
    expect(again).toMatchObject({ kind: 'replayed', fencedOut: false })
    if (first.kind === 'executed' && again.kind === 'replayed') {
      expect(again.response.body.equals(first.response.body)).toBe(true)
      expect(again.response.headers.location).toBe(first.response.headers.location)
    }
    expect(await countPayments(db.pool, 'lock')).toBeGreaterThan(0)
    expect(events.map((e) => e.type)).toEqual(['reserved', 'executed', 'replayed'])
  })

  it('runs 40 concurrent duplicates on two engines exactly once; the others get 409 or the replay', async () => {
    const a = lockEngine().engine
    const b = lockEngine().engine
    const key = freshKey()
    const outcomes = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        (i % 2 ? a : b).execute(
          input(key, {
            handler: async (ctx) => {
              await sleep(30)
              return pay(key)(ctx)
            },
          }),
        ),
      ),
    )
    const kinds = outcomes.map((o) => o.kind)
    expect(kinds.filter((k) => k === 'executed')).toHaveLength(1)
    expect(kinds.every((k) => ['executed', 'in_progress', 'replayed'].includes(k))).toBe(true)
    const conflict = outcomes.find((o) => o.kind === 'in_progress')
    if (conflict?.kind === 'in_progress') expect(conflict.retryAfterMs).toBe(1_000)
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
    expect(rows[0].n).toBe(1)
  })

  it('answers a different request body with the same key as a mismatch, even while the first runs', async () => {
    const { engine } = lockEngine({ replayCache: false })
    const key = freshKey()
    const { opened, open } = gate()
    const running = engine.execute(
      input(key, {
        handler: async (ctx) => {
          await opened
          return pay(key)(ctx)
        },
      }),
    )
    await sleep(50)
    // Nothing is committed while the first runs: a different body waits its turn (409), then is a mismatch.
    expect(await engine.execute(input(key, { fingerprint: fingerprintOf('other') }))).toMatchObject({
      kind: 'in_progress',
    })
    open()
    expect(await running).toMatchObject({ kind: 'executed' })
    expect(await engine.execute(input(key, { fingerprint: fingerprintOf('other') }))).toEqual({
      kind: 'mismatch',
    })
  })

  it('frees the key at once when the attempt crashes (no lease to wait out)', async () => {
    const crash = new Error('simulated crash after the lock')
    const { engine: crashing } = lockEngine({
      hooks: {
        afterReserve: () => {
          throw crash
        },
      },
    })
    const key = freshKey()
    await expect(crashing.execute(input(key))).rejects.toBe(crash)
    const { rows } = await db.pool.query('SELECT * FROM oncely.idempotency_keys WHERE key = $1', [key])
    expect(rows).toHaveLength(0)
    const { engine } = lockEngine()
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed', attempt: 1 })
    const { rows: paid } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [
      key,
    ])
    expect(paid[0].n).toBe(1)
  })

  it('frees the key when the connection holding the lock dies mid-handler', async () => {
    const { engine } = lockEngine()
    const key = freshKey()
    const killed = engine.execute(
      input(key, {
        handler: async (ctx) => {
          await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 1)', [
            ctx.scope,
            key,
          ])
          const { rows } = await ctx.tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')
          await db.pool.query('SELECT pg_terminate_backend($1)', [rows[0]!.pid])
          await ctx.tx.query('SELECT 1')
          return { status: 201, body: {} }
        },
      }),
    )
    expect(await killed).toMatchObject({ kind: 'retryable_failure', reason: 'error' })
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed' })
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
    expect(rows[0].n).toBe(1)
  })

  it('stores nothing after a retryable failure or a 5xx, and runs the next attempt', async () => {
    const { engine, events } = lockEngine()
    const key = freshKey()
    const failed = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key)(ctx)
          throw new Error('downstream timeout')
        },
      }),
    )
    expect(failed).toMatchObject({ kind: 'retryable_failure', reason: 'error' })
    const fiveHundred = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key)(ctx)
          return { status: 503, body: { error: 'busy' } }
        },
      }),
    )
    expect(fiveHundred).toMatchObject({ kind: 'retryable_failure', reason: 'server_error_response' })
    expect(events.filter((e) => e.type === 'released')).toHaveLength(2)
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed' })
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
    expect(rows[0].n).toBe(1)
  })

  it('stores a permanent error (business writes rolled back) and replays it', async () => {
    const { engine } = lockEngine({ replayCache: false })
    const key = freshKey()
    const rejected = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key)(ctx)
          throw Object.assign(new Error('card declined'), { statusCode: 402 })
        },
      }),
    )
    expect(rejected).toMatchObject({
      kind: 'executed',
      status: 'failed_permanent',
      response: { status: 402 },
    })
    const { rows } = await db.pool.query('SELECT status FROM oncely.idempotency_keys WHERE key = $1', [key])
    expect(rows[0].status).toBe('failed_permanent')
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'replayed', response: { status: 402 } })
    const { rows: paid } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [
      key,
    ])
    expect(paid[0].n).toBe(0)
  })

  it('takes over an abandoned row-protocol reservation, and fences the late original', async () => {
    const { opened, open } = gate()
    const reached = gate()
    const { engine: rowEngine } = engineFor(db.pool, { leaseMs: 200, retentionMs: 60_000 })
    const key = freshKey()
    const original = rowEngine.execute(
      input(key, {
        handler: async (ctx) => {
          await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 7)', [
            ctx.scope,
            key,
          ])
          reached.open()
          await opened
          return { status: 201, body: { by: 'original' } }
        },
      }),
    )
    await reached.opened
    const { engine } = lockEngine()
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'in_progress' })
    await sleep(300)
    const takeover = await engine.execute(input(key, { handler: pay(key, { by: 'takeover' }) }))
    expect(takeover).toMatchObject({ kind: 'executed', attempt: 2 })
    open()
    const late = await original
    expect(late).toMatchObject({ kind: 'replayed', fencedOut: true })
    if (late.kind === 'replayed')
      expect(JSON.parse(late.response.body.toString())).toEqual({ by: 'takeover' })
    const { rows } = await db.pool.query('SELECT amount FROM payments WHERE cart = $1', [key])
    expect(rows.map((r) => r.amount)).toEqual([100])
  })

  it('is fenced out by a row-protocol reservation made while it ran (mixed modes on one table)', async () => {
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
    const { engine: rowEngine } = engineFor(db.pool)
    expect(await rowEngine.execute(input(key, { handler: pay(key, { by: 'row' }) }))).toMatchObject({
      kind: 'executed',
    })
    open()
    const outcome = await locked
    expect(outcome).toMatchObject({ kind: 'replayed', fencedOut: true })
    if (outcome.kind === 'replayed')
      expect(JSON.parse(outcome.response.body.toString())).toEqual({ by: 'row' })
    expect(events.some((e) => e.type === 'fenced_out')).toBe(true)
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
    expect(rows[0].n).toBe(1)
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
    await engineFor(db.pool).engine.execute(input(key))
    open()
    expect(await locked).toMatchObject({ kind: 'executed' })
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [key])
    expect(rows[0].n).toBe(2)
  })

  it('starts over on an expired record', async () => {
    const { engine, events } = lockEngine({ replayCache: false })
    const key = freshKey()
    await engine.execute(input(key))
    await db.pool.query(
      `UPDATE oncely.idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`,
      [key],
    )
    const again = await engine.execute(input(key, { fingerprint: fingerprintOf('new body') }))
    expect(again).toMatchObject({ kind: 'executed', attempt: 1 })
    expect(events.some((e) => e.type === 'expired')).toBe(true)
    const { rows } = await db.pool.query('SELECT fingerprint FROM oncely.idempotency_keys WHERE key = $1', [
      key,
    ])
    expect(rows[0].fingerprint).toBe(fingerprintOf('new body'))
  })

  it('stores hostile keys and large bodies byte for byte, with and without prepared statements', async () => {
    for (const preparedStatements of [true, false]) {
      const engine = createEngine({
        store: postgresStore({ pool: db.pool, preparedStatements }),
        reservation: 'lock',
        replayCache: false,
      })
      const key = `${freshKey()}'; DROP TABLE payments; -- \\' \\\\ "`
      const big = Buffer.alloc(100_000, 'x').toString()
      for (const body of [{ small: "it's" }, { big }]) {
        const k = `${key}-${Object.keys(body)[0]}`
        const first = await engine.execute(input(k, { handler: pay(k, body) }))
        expect(first).toMatchObject({ kind: 'executed' })
        const replay = await engine.execute(input(k))
        expect(replay.kind).toBe('replayed')
        if (first.kind === 'executed' && replay.kind === 'replayed') {
          expect(replay.response.body.equals(first.response.body)).toBe(true)
        }
      }
    }
  })

  it('waits (bounded) for the holder with `wait` and returns its response', async () => {
    const { engine } = lockEngine()
    const key = freshKey()
    const first = engine.execute(
      input(key, {
        handler: async (ctx) => {
          await sleep(150)
          return pay(key)(ctx)
        },
      }),
    )
    await sleep(30)
    const waited = await engine.execute(input(key, { wait: { timeoutMs: 5_000 } }))
    expect(waited).toMatchObject({ kind: 'replayed' })
    expect(await first).toMatchObject({ kind: 'executed' })
  })

  it('writes a leased row on the first recovery point, so a crash after it is taken over like in the row protocol', async () => {
    const crash = new Error('simulated crash before the commit')
    const { engine: crashing } = lockEngine({
      leaseMs: 300,
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
    const { rows } = await db.pool.query('SELECT * FROM oncely.idempotency_keys WHERE key = $1', [key])
    expect(rows[0]).toMatchObject({ status: 'in_progress', recovery_point: 'charged', attempts: 1 })
    expect(rows[0].lock_token).not.toBeNull()

    const { engine, events } = lockEngine({ leaseMs: 300, retentionMs: 60_000 })
    const duplicate = await engine.execute(input(key))
    expect(duplicate).toMatchObject({ kind: 'in_progress' })
    if (duplicate.kind === 'in_progress') expect(duplicate.retryAfterMs).toBeLessThanOrEqual(300)
    await sleep(350)
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
    const { rows: paid } = await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [
      key,
    ])
    expect(paid[0].n).toBe(1)
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
    const { rows } = await db.pool.query(
      'SELECT status, recovery_point FROM oncely.idempotency_keys WHERE key = $1',
      [key],
    )
    expect(rows[0]).toEqual({ status: 'failed_retryable', recovery_point: 'one' })
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
    const { rows: after } = await db.pool.query(
      'SELECT status, attempts, lock_token FROM oncely.idempotency_keys WHERE key = $1',
      [key],
    )
    expect(after[0]).toEqual({ status: 'failed_permanent', attempts: 2, lock_token: null })
  })

  it('checks the option', () => {
    expect(() =>
      createEngine({ store: postgresStore({ pool: db.pool }), reservation: 'locks' as never }),
    ).toThrow(/`reservation` to be 'row' or 'lock', got "locks"/)
  })

  it('does not leave a connection or a lock behind', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 })
    try {
      const engine = createEngine({ store: postgresStore({ pool }), reservation: 'lock' })
      for (let i = 0; i < 20; i++) {
        const key = freshKey()
        await engine.execute(input(key))
        await engine.execute(input(key))
        await engine.execute(input(key, { fingerprint: fingerprintOf('x') }))
      }
      await sleep(50)
      const { rows } = await db.pool.query(
        `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND database =
           (SELECT oid FROM pg_database WHERE datname = current_database())`,
      )
      expect(rows[0].n).toBe(0)
      expect(pool.idleCount).toBe(pool.totalCount)
    } finally {
      await pool.end()
    }
  })
})
