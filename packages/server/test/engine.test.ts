// The storage/engine contract suite: one block per numbered point of the protocol, against a real Postgres.
import type { TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  createEngine,
  type ExecutionContext,
  type HandlerResponse,
  insertOrExisting,
  postgresStore,
} from '../src/index.js'
import { countPayments, engineFor, fingerprintOf, freshKey, setupDatabase, sleep } from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('engine')
})
afterAll(() => db.drop())

const op = 'POST /v1/payments'

/** A handler that inserts one payment for the tenant and answers 201 with its id. */
function pay(cart: string, extra: HandlerResponse['headers'] = {}) {
  return async (ctx: ExecutionContext): Promise<HandlerResponse> => {
    const { rows } = await ctx.tx.query(
      'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100) RETURNING id',
      [ctx.scope, cart],
    )
    return {
      status: 201,
      headers: { location: `/v1/payments/${rows[0].id}`, ...extra },
      body: { id: rows[0].id },
    }
  }
}

function deferred() {
  let resolve!: () => void
  const promise = new Promise<void>((r) => {
    resolve = r
  })
  return { promise, resolve }
}

describe('1. the record', () => {
  it('stores fingerprint, status, lease, response, attempts and times in one row per (scope, operation, key)', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    await engine.execute({
      scope: 't1',
      operation: op,
      key,
      fingerprint: fingerprintOf({ a: 1 }),
      handler: pay(key),
    })
    const { rows } = await db.pool.query('SELECT * FROM oncely.idempotency_keys WHERE key = $1', [key])
    expect(rows).toHaveLength(1)
    const row = rows[0]
    expect(row).toMatchObject({
      scope: 't1',
      operation: op,
      status: 'succeeded',
      attempts: 1,
      response_status: 201,
    })
    expect(row.fingerprint).toBe(fingerprintOf({ a: 1 }))
    expect(row.lock_token).toMatch(/^[0-9a-f-]{36}$/)
    expect(row.response_headers.location).toMatch(/^\/v1\/payments\/\d+$/)
    expect(Buffer.isBuffer(row.response_body)).toBe(true)
    expect(row.expires_at.getTime() - row.created_at.getTime()).toBe(86_400_000)
  })

  it('rejects a status outside the four values (check constraint)', async () => {
    await expect(
      db.pool.query(
        `INSERT INTO oncely.idempotency_keys (scope, operation, key, fingerprint, status, expires_at)
         VALUES ('t', 'o', 'k', 'f', 'done', now())`,
      ),
    ).rejects.toMatchObject({ code: '23514' })
  })
})

describe('2. reservation', () => {
  it('runs the handler once for 20 concurrent executions of one key', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const fingerprint = fingerprintOf({ n: 2 })
    let runs = 0
    const outcomes = await Promise.all(
      Array.from({ length: 20 }, () =>
        engine.execute({
          scope: 't2',
          operation: op,
          key,
          fingerprint,
          handler: async (ctx) => {
            runs++
            await sleep(50)
            return pay(key)(ctx)
          },
        }),
      ),
    )
    expect(runs).toBe(1)
    expect(await countPayments(db.pool, 't2')).toBe(1)
    expect(outcomes.filter((o) => o.kind === 'executed')).toHaveLength(1)
    expect(outcomes.every((o) => ['executed', 'in_progress', 'replayed'].includes(o.kind))).toBe(true)
  })

  it('takes lease and expiry from the database clock', async () => {
    const { engine } = engineFor(db.pool, { leaseMs: 7_000 })
    const key = freshKey()
    const release = deferred()
    const running = engine.execute({
      scope: 't2',
      operation: op,
      key,
      fingerprint: 'f',
      handler: async () => {
        await release.promise
        return { status: 200 }
      },
    })
    await sleep(100)
    const { rows } = await db.pool.query(
      `SELECT extract(epoch FROM locked_until - updated_at) * 1000 AS lease FROM oncely.idempotency_keys WHERE key = $1`,
      [key],
    )
    expect(Number(rows[0].lease)).toBe(7_000)
    release.resolve()
    await running
  })
})

describe('3. scope', () => {
  it('keeps the same key in two tenants and on two operations as separate records', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const fingerprint = fingerprintOf({})
    const a = await engine.execute({ scope: 'tA', operation: op, key, fingerprint, handler: pay(`${key}a`) })
    const b = await engine.execute({ scope: 'tB', operation: op, key, fingerprint, handler: pay(`${key}b`) })
    const c = await engine.execute({
      scope: 'tA',
      operation: 'POST /v1/refunds',
      key,
      fingerprint,
      handler: pay(`${key}c`),
    })
    expect([a.kind, b.kind, c.kind]).toEqual(['executed', 'executed', 'executed'])
  })
})

describe('4. fingerprint', () => {
  it('answers mismatch for another fingerprint, before the in-progress check', async () => {
    const { engine, events } = engineFor(db.pool)
    const key = freshKey()
    const release = deferred()
    const first = engine.execute({
      scope: 't4',
      operation: op,
      key,
      fingerprint: fingerprintOf({ amount: 1 }),
      handler: async () => {
        await release.promise
        return { status: 201, body: 'secret response' }
      },
    })
    await sleep(50)
    const other = await engine.execute({
      scope: 't4',
      operation: op,
      key,
      fingerprint: fingerprintOf({ amount: 2 }),
      handler: async () => ({ status: 200 }),
    })
    expect(other).toEqual({ kind: 'mismatch' })
    release.resolve()
    await first
    const after = await engine.execute({
      scope: 't4',
      operation: op,
      key,
      fingerprint: fingerprintOf({ amount: 2 }),
      handler: async () => ({ status: 200 }),
    })
    expect(after).toEqual({ kind: 'mismatch' })
    expect(events.filter((e) => e.type === 'mismatch')).toHaveLength(2)
  })
})

describe('5. same transaction', () => {
  it('leaves no business write behind when the handler throws', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const outcome = await engine.execute({
      scope: 't5',
      operation: op,
      key,
      fingerprint: 'f',
      handler: async (ctx) => {
        await pay(key)(ctx)
        throw new Error('downstream timed out')
      },
    })
    expect(outcome).toMatchObject({ kind: 'retryable_failure', reason: 'error' })
    expect(await countPayments(db.pool, 't5')).toBe(0)
  })
})

describe('6. in flight', () => {
  it('answers in_progress promptly with the remaining lease, without queueing behind the first', async () => {
    const { engine, events } = engineFor(db.pool, { leaseMs: 10_000 })
    const key = freshKey()
    const release = deferred()
    const first = engine.execute({
      scope: 't6',
      operation: op,
      key,
      fingerprint: 'f',
      handler: async (ctx) => {
        const result = await pay(key)(ctx) // holds row locks in the open transaction
        await release.promise
        return result
      },
    })
    await sleep(100)
    const second = await engine.execute({
      scope: 't6',
      operation: op,
      key,
      fingerprint: 'f',
      handler: pay(key),
    })
    expect(second.kind).toBe('in_progress')
    if (second.kind !== 'in_progress') return
    expect(second.retryAfterMs).toBeGreaterThan(9_000)
    expect(second.retryAfterMs).toBeLessThanOrEqual(10_000)
    expect(events.some((e) => e.type === 'conflict')).toBe(true)
    release.resolve()
    expect((await first).kind).toBe('executed')
  })

  it('answers replays and 409s without waiting on a lock held on the key row (regression: ON CONFLICT DO UPDATE locked it)', async () => {
    const { engine } = engineFor(db.pool)
    const done = freshKey()
    const busy = freshKey()
    await engine.execute({ scope: 't6l', operation: op, key: done, fingerprint: 'f', handler: pay(done) })
    const release = deferred()
    const first = engine.execute({
      scope: 't6l',
      operation: op,
      key: busy,
      fingerprint: 'f',
      handler: async () => {
        await release.promise
        return { status: 201 }
      },
    })
    await sleep(50)
    const locker = await db.pool.connect()
    try {
      await locker.query('BEGIN')
      await locker.query(`SELECT 1 FROM oncely.idempotency_keys WHERE key IN ($1, $2) FOR UPDATE`, [
        done,
        busy,
      ])
      const answers = Promise.all([
        engine.execute({ scope: 't6l', operation: op, key: done, fingerprint: 'f', handler: pay(done) }),
        engine.execute({ scope: 't6l', operation: op, key: busy, fingerprint: 'f', handler: pay(busy) }),
      ])
      const result = await Promise.race([answers, sleep(3_000).then(() => 'blocked' as const)])
      expect(result).not.toBe('blocked')
      if (result === 'blocked') return
      expect(result.map((o) => o.kind)).toEqual(['replayed', 'in_progress'])
    } finally {
      await locker.query('ROLLBACK')
      locker.release()
      release.resolve()
      await first
    }
  })

  it('waits for the first attempt when asked, and returns its response', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const first = engine.execute({
      scope: 't6',
      operation: op,
      key,
      fingerprint: 'f',
      handler: async (ctx) => {
        await sleep(300)
        return pay(key)(ctx)
      },
    })
    await sleep(50)
    const second = await engine.execute({
      scope: 't6',
      operation: op,
      key,
      fingerprint: 'f',
      wait: { timeoutMs: 5_000 },
      handler: pay(key),
    })
    const done = await first
    expect(second.kind).toBe('replayed')
    if (second.kind !== 'replayed' || done.kind !== 'executed') return
    expect(second.response.body.equals(done.response.body)).toBe(true)
  })
})

describe('7. crashes and pauses', () => {
  it('takes over a key abandoned after reservation once its lease ran out', async () => {
    const key = freshKey()
    const crashing = engineFor(db.pool, {
      leaseMs: 300,
      hooks: {
        afterReserve: () => {
          throw new Error('crash')
        },
      },
    })
    await expect(
      crashing.engine.execute({ scope: 't7', operation: op, key, fingerprint: 'f', handler: pay(key) }),
    ).rejects.toThrow('crash')
    const { engine, events } = engineFor(db.pool, { leaseMs: 300 })
    const blocked = await engine.execute({
      scope: 't7',
      operation: op,
      key,
      fingerprint: 'f',
      handler: pay(key),
    })
    expect(blocked.kind).toBe('in_progress')
    await sleep(350)
    const retry = await engine.execute({
      scope: 't7',
      operation: op,
      key,
      fingerprint: 'f',
      handler: pay(key),
    })
    expect(retry).toMatchObject({ kind: 'executed', attempt: 2 })
    expect(events.some((e) => e.type === 'takeover')).toBe(true)
    expect(await countPayments(db.pool, 't7')).toBe(1)
  })

  it('fences out an attempt paused past its lease: its writes roll back and it answers with the winner', async () => {
    const key = freshKey()
    const paused = deferred()
    const reachedCommit = deferred()
    const slow = engineFor(db.pool, {
      leaseMs: 200,
      hooks: {
        beforeCommit: async () => {
          reachedCommit.resolve()
          await paused.promise
        },
      },
    })
    const original = slow.engine.execute({
      scope: 't7f',
      operation: op,
      key,
      fingerprint: 'f',
      handler: pay(`${key}-1`),
    })
    await reachedCommit.promise
    await sleep(250)
    const { engine } = engineFor(db.pool, { leaseMs: 200 })
    const winner = await engine.execute({
      scope: 't7f',
      operation: op,
      key,
      fingerprint: 'f',
      handler: pay(`${key}-2`),
    })
    expect(winner).toMatchObject({ kind: 'executed', attempt: 2 })
    paused.resolve()
    const late = await original
    expect(late).toMatchObject({ kind: 'replayed', fencedOut: true })
    if (late.kind !== 'replayed' || winner.kind !== 'executed') return
    expect(late.response.body.equals(winner.response.body)).toBe(true)
    const carts = await db.pool.query('SELECT cart FROM payments WHERE tenant = $1', ['t7f'])
    expect(carts.rows).toEqual([{ cart: `${key}-2` }])
    expect(slow.events.some((e) => e.type === 'fenced_out')).toBe(true)
  })

  it('with unsafe.disableFencing the paused attempt commits too (so a checker can see duplicates)', async () => {
    const key = freshKey()
    const paused = deferred()
    const reachedCommit = deferred()
    const unsafe = engineFor(db.pool, {
      leaseMs: 200,
      unsafe: { disableFencing: true },
      hooks: {
        beforeCommit: async () => {
          reachedCommit.resolve()
          await paused.promise
        },
      },
    })
    const original = unsafe.engine.execute({
      scope: 't7u',
      operation: op,
      key,
      fingerprint: 'f',
      handler: pay(`${key}-1`),
    })
    await reachedCommit.promise
    await sleep(250)
    const { engine } = engineFor(db.pool, { leaseMs: 200 })
    await engine.execute({ scope: 't7u', operation: op, key, fingerprint: 'f', handler: pay(`${key}-2`) })
    paused.resolve()
    expect((await original).kind).toBe('executed')
    expect(await countPayments(db.pool, 't7u')).toBe(2)
  })
})

describe('8. failure semantics', () => {
  it('stores and replays a permanent failure (a thrown 4xx), with the business writes rolled back', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    let runs = 0
    const handler = async (ctx: ExecutionContext) => {
      runs++
      await pay(key)(ctx)
      throw Object.assign(new Error('card declined'), { statusCode: 402, code: 'card_declined' })
    }
    const first = await engine.execute({ scope: 't8', operation: op, key, fingerprint: 'f', handler })
    const second = await engine.execute({ scope: 't8', operation: op, key, fingerprint: 'f', handler })
    expect(first).toMatchObject({ kind: 'executed', status: 'failed_permanent', response: { status: 402 } })
    expect(second).toMatchObject({ kind: 'replayed', response: { status: 402 } })
    if (first.kind !== 'executed' || second.kind !== 'replayed') return
    expect(JSON.parse(second.response.body.toString())).toMatchObject({
      statusCode: 402,
      code: 'card_declined',
    })
    expect(runs).toBe(1)
    expect(await countPayments(db.pool, 't8')).toBe(0)
  })

  it('stores a returned 4xx as failed_permanent', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const handler = async () => ({ status: 402, body: { code: 'card_declined' } })
    await engine.execute({ scope: 't8', operation: op, key, fingerprint: 'f', handler })
    const again = await engine.execute({ scope: 't8', operation: op, key, fingerprint: 'f', handler })
    expect(again).toMatchObject({ kind: 'replayed', response: { status: 402 } })
  })

  it.each([
    ['a thrown 503', Object.assign(new Error('upstream'), { statusCode: 503 })],
    ['a serialization failure', Object.assign(new Error('could not serialize'), { code: '40001' })],
    ['a deadlock', Object.assign(new Error('deadlock detected'), { code: '40P01' })],
    ['a network error', Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' })],
  ])('releases the key after %s so the retry re-executes', async (_, error) => {
    const { engine, events } = engineFor(db.pool)
    const key = freshKey()
    let runs = 0
    const handler = async (ctx: ExecutionContext) => {
      if (++runs === 1) throw error
      return pay(key)(ctx)
    }
    const first = await engine.execute({ scope: 't8r', operation: op, key, fingerprint: 'f', handler })
    expect(first).toMatchObject({ kind: 'retryable_failure', reason: 'error', error })
    expect(events.some((e) => e.type === 'released')).toBe(true)
    const second = await engine.execute({ scope: 't8r', operation: op, key, fingerprint: 'f', handler })
    expect(second).toMatchObject({ kind: 'executed', attempt: 2 })
  })

  it('does not store a returned 5xx and rolls back its writes', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const outcome = await engine.execute({
      scope: 't8s',
      operation: op,
      key,
      fingerprint: 'f',
      handler: async (ctx) => {
        await pay(key)(ctx)
        return { status: 502, body: 'bad gateway' }
      },
    })
    expect(outcome).toMatchObject({ kind: 'retryable_failure', reason: 'server_error_response' })
    expect(await countPayments(db.pool, 't8s')).toBe(0)
    const retry = await engine.execute({
      scope: 't8s',
      operation: op,
      key,
      fingerprint: 'f',
      handler: pay(key),
    })
    expect(retry.kind).toBe('executed')
  })

  it('lets the caller override the classification', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const outcome = await engine.execute({
      scope: 't8c',
      operation: op,
      key,
      fingerprint: 'f',
      classify: () => 'permanent',
      renderError: () => ({ status: 409, body: { code: 'already_refunded' } }),
      handler: async () => {
        throw new Error('already refunded')
      },
    })
    expect(outcome).toMatchObject({ kind: 'executed', status: 'failed_permanent', response: { status: 409 } })
  })
})

describe('9. replay', () => {
  it('replays exact status, body bytes and allowlisted headers only', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const body = Buffer.from([0, 1, 2, 255, 254, 10, 13])
    const handler = async () => ({
      status: 202,
      headers: {
        'Content-Type': 'application/octet-stream',
        ETag: '"v1"',
        'set-cookie': 'session=x',
        'x-internal': 'y',
      },
      body,
    })
    await engine.execute({ scope: 't9', operation: op, key, fingerprint: 'f', handler })
    const replay = await engine.execute({ scope: 't9', operation: op, key, fingerprint: 'f', handler })
    expect(replay.kind).toBe('replayed')
    if (replay.kind !== 'replayed') return
    expect(replay.response.status).toBe(202)
    expect(replay.response.body.equals(body)).toBe(true)
    expect(replay.response.headers).toEqual({ 'content-type': 'application/octet-stream', etag: '"v1"' })
  })

  it('refuses set-cookie in the replay allowlist', () => {
    expect(() => engineFor(db.pool, { replayHeaders: ['location', 'Set-Cookie'] })).toThrow(/replayHeaders/)
  })

  it('fails a response over maxResponseBytes at completion: writes rolled back, key released', async () => {
    const { engine } = engineFor(db.pool, { maxResponseBytes: 10 })
    const key = freshKey()
    const outcome = await engine.execute({
      scope: 't9l',
      operation: op,
      key,
      fingerprint: 'f',
      handler: async (ctx) => {
        await pay(key)(ctx)
        return { status: 201, body: 'x'.repeat(11) }
      },
    })
    expect(outcome).toMatchObject({ kind: 'retryable_failure', reason: 'response_too_large' })
    expect(await countPayments(db.pool, 't9l')).toBe(0)
    const { rows } = await db.pool.query('SELECT status FROM oncely.idempotency_keys WHERE key = $1', [key])
    expect(rows[0].status).toBe('failed_retryable')
  })
})

describe('12. retention', () => {
  it('treats an expired key as new', async () => {
    const { engine, events } = engineFor(db.pool, { leaseMs: 50, retentionMs: 200 })
    const key = freshKey()
    await engine.execute({ scope: 't12', operation: op, key, fingerprint: 'f1', handler: pay(`${key}-1`) })
    await sleep(250)
    const again = await engine.execute({
      scope: 't12',
      operation: op,
      key,
      fingerprint: 'f2',
      handler: pay(`${key}-2`),
    })
    expect(again).toMatchObject({ kind: 'executed', attempt: 1 })
    expect(events.some((e) => e.type === 'expired')).toBe(true)
  })

  it('reaps expired rows in bounded batches, with several reapers at once', async () => {
    const reapDb = await setupDatabase('reap')
    try {
      await reapDb.pool.query(
        `INSERT INTO oncely.idempotency_keys (scope, operation, key, fingerprint, status, expires_at)
         SELECT 's', 'o', 'k' || g, 'f', 'succeeded', now() - interval '1 second' FROM generate_series(1, 250) g`,
      )
      await reapDb.pool.query(
        `INSERT INTO oncely.idempotency_keys (scope, operation, key, fingerprint, status, expires_at)
         VALUES ('s', 'o', 'live', 'f', 'succeeded', now() + interval '1 hour')`,
      )
      const { engine } = engineFor(reapDb.pool)
      const counts = await Promise.all([engine.reap({ batchSize: 40 }), engine.reap({ batchSize: 40 })])
      expect(counts[0] + counts[1]).toBe(250)
      const { rows } = await reapDb.pool.query('SELECT key FROM oncely.idempotency_keys')
      expect(rows).toEqual([{ key: 'live' }])
      expect(await engine.reap({ batchSize: 10, maxBatches: 1 })).toBe(0)
    } finally {
      await reapDb.drop()
    }
  })
})

describe('13. store unavailable', () => {
  const missing = () => postgresStore({ pool: db.pool, schema: 'no_such_schema' })

  it('fails closed: no handler run, unavailable with a retry hint', async () => {
    const events: string[] = []
    const engine = createEngine({ store: missing(), onEvent: (e) => events.push(e.type) })
    let runs = 0
    const outcome = await engine.execute({
      scope: 't13',
      operation: op,
      key: freshKey(),
      fingerprint: 'f',
      handler: async () => {
        runs++
        return { status: 200 }
      },
    })
    expect(outcome).toMatchObject({ kind: 'unavailable', retryAfterMs: 1_000 })
    expect(runs).toBe(0)
    expect(events).toContain('store_error')
  })

  it('fails open only when asked', async () => {
    const engine = createEngine({ store: missing() })
    const outcome = await engine.execute({
      scope: 't13',
      operation: op,
      key: freshKey(),
      fingerprint: 'f',
      failOpen: true,
      handler: async () => ({ status: 200, body: 'ok' }),
    })
    expect(outcome).toMatchObject({ kind: 'executed', failedOpen: true })
  })
})

describe('14. natural-key backstop', () => {
  it('maps a unique violation on the business constraint to the existing resource', async () => {
    const { engine } = engineFor(db.pool, { leaseMs: 50, retentionMs: 100 })
    const cart = freshKey('cart')
    const handler = async (ctx: ExecutionContext) => {
      const { created, value } = await insertOrExisting(ctx.tx, {
        constraint: 'orders_cart_key',
        insert: (tx) =>
          tx
            .query('INSERT INTO orders (tenant, cart) VALUES ($1, $2) RETURNING id', [ctx.scope, cart])
            .then((r) => r.rows[0]),
        existing: (tx) =>
          tx
            .query('SELECT id FROM orders WHERE tenant = $1 AND cart = $2', [ctx.scope, cart])
            .then((r) => r.rows[0]),
      })
      return { status: created ? 201 : 200, body: value }
    }
    const first = await engine.execute({
      scope: 't14',
      operation: op,
      key: freshKey(),
      fingerprint: 'f',
      handler,
    })
    // The key expired (or the client lost it): a very late retry arrives as a new request with a new key.
    const late = await engine.execute({
      scope: 't14',
      operation: op,
      key: freshKey(),
      fingerprint: 'f',
      handler,
    })
    expect(first).toMatchObject({ kind: 'executed', response: { status: 201 } })
    expect(late).toMatchObject({ kind: 'executed', response: { status: 200 } })
    if (first.kind !== 'executed' || late.kind !== 'executed') return
    expect(late.response.body.toString()).toBe(first.response.body.toString())
    const { rows } = await db.pool.query(`SELECT count(*)::int AS n FROM orders WHERE tenant = 't14'`)
    expect(rows[0].n).toBe(1)
  })

  it('rethrows violations of other constraints', async () => {
    const client = await db.pool.connect()
    try {
      await client.query('BEGIN')
      await client.query(`INSERT INTO orders (id, tenant, cart) VALUES (999999, 'x', 'y')`)
      await expect(
        insertOrExisting(client, {
          constraint: 'orders_cart_key',
          insert: (tx) => tx.query(`INSERT INTO orders (id, tenant, cart) VALUES (999999, 'x', 'z')`),
          existing: async () => undefined,
        }),
      ).rejects.toMatchObject({ code: '23505', constraint: 'orders_pkey' })
    } finally {
      await client.query('ROLLBACK')
      client.release()
    }
  })
})

describe('steps and recovery points', () => {
  it('derives deterministic step keys and keeps the recovery point for the next attempt', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const seen: Array<{ point: string | null; charge: string }> = []
    const handler = async (ctx: ExecutionContext) => {
      seen.push({ point: ctx.recoveryPoint, charge: ctx.stepKey('charge') })
      if (ctx.attempt === 1) {
        expect(await ctx.saveRecoveryPoint('charged')).toBe(true)
        throw new Error('crashed after the charge')
      }
      return { status: 201 }
    }
    await engine.execute({ scope: 'ts', operation: op, key, fingerprint: 'f', handler })
    await engine.execute({ scope: 'ts', operation: op, key, fingerprint: 'f', handler })
    expect(seen).toHaveLength(2)
    expect(seen[1]).toEqual({ point: 'charged', charge: seen[0]?.charge })
    expect(seen[0]?.charge).toMatch(/^[0-9a-f]{64}$/)
  })
})

describe('options', () => {
  it('names the bad option', () => {
    expect(() => engineFor(db.pool, { leaseMs: -1 })).toThrow('Expected `leaseMs` to be a positive integer')
    expect(() => engineFor(db.pool, { leaseMs: 10_000, retentionMs: 5_000 })).toThrow(/retentionMs/)
    expect(() => postgresStore({ pool: db.pool, table: '' })).toThrow('Expected `table`')
  })
})
