// The engine's contract suite, against a real Postgres: one block per numbered point of the protocol. It runs once
// per reservation protocol (vitest.config.ts); where the two legitimately answer differently (what an attempt in
// flight leaves behind), the expectation names the protocol. What only one protocol does is in protocols.test.ts.
import { type TestDatabase, waitFor } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  createEngine,
  type ExecuteInput,
  type ExecutionContext,
  insertOrExisting,
  postgresStore,
} from '../src/index.js'
import {
  engineFor,
  fingerprintOf,
  freshKey,
  gate,
  keyFree,
  keyRecord,
  onCitus,
  pay,
  paymentsFor,
  payRequest,
  pooled,
  reservation,
  running,
  setupDatabase,
  sleep,
  stallEventLoop,
} from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('engine')
})
afterAll(() => db.drop())

const op = 'POST /v1/payments'
const row = reservation === 'row'

const input = (key: string, extra: Partial<ExecuteInput> = {}) => payRequest('tenant', key, extra)

const record = (key: string) => keyRecord(db.pool, key)

describe('1. the record', () => {
  it('stores fingerprint, status, response, attempts and times in one row per (scope, operation, key), in the commit of the business write', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    await engine.execute(input(key, { fingerprint: fingerprintOf({ a: 1 }) }))
    const { rows } = await db.pool.query('SELECT * FROM oncely.idempotency_keys WHERE key = $1', [key])
    expect(rows).toHaveLength(1)
    expect(rows[0]).toMatchObject({
      scope: 'tenant',
      operation: op,
      status: 'succeeded',
      attempts: 1,
      response_status: 201,
      fingerprint: fingerprintOf({ a: 1 }),
    })
    expect(rows[0].response_headers.location).toMatch(/^\/v1\/payments\/\d+$/)
    expect(Buffer.isBuffer(rows[0].response_body)).toBe(true)
    expect(rows[0].expires_at.getTime() - rows[0].created_at.getTime()).toBe(86_400_000)
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it('refuses a key over 255 characters before it reaches the table, which has no CHECK on it', async () => {
    const { engine } = engineFor(db.pool)
    const key = `${freshKey()}-`.padEnd(256, 'k')
    await expect(engine.execute(input(key))).rejects.toThrow(
      new TypeError('Expected `key` to have at most 255 characters, got 256.'),
    )
    expect(await record(key)).toBeUndefined()
  })
})

describe('2. reservation', () => {
  it('runs the handler once for 40 concurrent executions of one key on two engines', async () => {
    const a = engineFor(db.pool).engine
    const b = engineFor(db.pool).engine
    const key = freshKey()
    let runs = 0
    const outcomes = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        (i % 2 ? a : b).execute(
          input(key, {
            handler: async (ctx) => {
              runs++
              await sleep(50)
              return pay(key)(ctx)
            },
          }),
        ),
      ),
    )
    expect(runs).toBe(1)
    expect(await paymentsFor(db.pool, key)).toBe(1)
    expect(outcomes.filter((o) => o.kind === 'executed')).toHaveLength(1)
    expect(outcomes.every((o) => ['executed', 'in_progress', 'replayed'].includes(o.kind))).toBe(true)
  })

  it('arms the lease guard: the business transaction may sit idle for at most the lease', async () => {
    const { engine } = engineFor(db.pool, { leaseMs: 7_000 })
    let setting: string | undefined
    await engine.execute(
      input(freshKey(), {
        handler: async (ctx) => {
          // On Citus under the lock protocol the guard is armed where the key's lock is: on the worker holding the
          // tenant's shard (the statement that arms it runs there). Read it there, through the same transaction.
          const where =
            onCitus && !row
              ? `SELECT current_setting('idle_in_transaction_session_timeout') AS guard
                 FROM (SELECT 1) AS one LEFT JOIN (SELECT 1 FROM payments WHERE tenant = $1 LIMIT 1) AS p ON true`
              : `SELECT current_setting('idle_in_transaction_session_timeout') AS guard WHERE $1::text IS NOT NULL`
          setting = (await ctx.tx.query(where, [ctx.scope])).rows[0].guard
          return { status: 200 }
        },
      }),
    )
    expect(setting).toBe('7s')
    // Transaction-local: the connection goes back to the pool without it.
    const { rows } = await db.pool.query('SHOW idle_in_transaction_session_timeout')
    expect(rows[0].idle_in_transaction_session_timeout).toBe('0')
  })
})

describe('3. scope', () => {
  it('keeps the same key in two tenants and on two operations as separate records', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const a = await engine.execute(input(key, { scope: 'tA', handler: pay(`${key}a`) }))
    const b = await engine.execute(input(key, { scope: 'tB', handler: pay(`${key}b`) }))
    const c = await engine.execute(
      input(key, { scope: 'tA', operation: 'POST /v1/refunds', handler: pay(`${key}c`) }),
    )
    expect([a.kind, b.kind, c.kind]).toEqual(['executed', 'executed', 'executed'])
  })

  it('refuses a scope or an operation too long for the key index, naming it, before the store is asked', async () => {
    const { engine, events } = engineFor(db.pool)
    const long = 'é'.repeat(300) // 600 bytes in UTF-8
    await expect(engine.execute(input(freshKey(), { scope: long }))).rejects.toThrow(
      'Expected `scope` to have at most 512 bytes (UTF-8), got 600',
    )
    await expect(
      engine.execute(input(freshKey(), { operation: `POST /${'x'.repeat(600)}` })),
    ).rejects.toThrow(/`operation` to have at most 512 bytes/)
    expect(events.some((e) => e.type === 'store_error')).toBe(false)
    // At the limits (and with the longest key), the key record is written: the index takes it.
    const key = freshKey().padEnd(255, 'k')
    const atLimit = input(key, { scope: 'é'.repeat(256), operation: 'o'.repeat(512), handler: pay(key) })
    expect(await engine.execute(atLimit)).toMatchObject({ kind: 'executed' })
  })
})

describe('4. fingerprint', () => {
  it('never runs another request under a key in use, and answers it mismatch once the first finished', async () => {
    const { engine, events } = engineFor(db.pool)
    const key = freshKey()
    const release = gate()
    const held = running(async () => {
      await release.opened
      return { status: 201, body: 'secret response' }
    })
    const first = engine.execute(
      input(key, { fingerprint: fingerprintOf({ amount: 1 }), handler: held.handler }),
    )
    await held.started
    const other = input(key, { fingerprint: fingerprintOf({ amount: 2 }), handler: pay(`${key}-other`) })
    // The row protocol committed the first request's row, so it can say mismatch at once; the lock protocol has
    // nothing committed yet and says 409, which a client retries into the mismatch.
    expect(await engine.execute(other)).toMatchObject({ kind: row ? 'mismatch' : 'in_progress' })
    release.open()
    await first
    expect(await engine.execute(other)).toEqual({ kind: 'mismatch' })
    expect(events.filter((e) => e.type === 'mismatch').length).toBeGreaterThanOrEqual(1)
    expect(await paymentsFor(db.pool, `${key}-other`)).toBe(0)
  })
})

describe('5. same transaction', () => {
  it('leaves no business write behind when the handler throws', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const outcome = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key)(ctx)
          throw new Error('downstream timed out')
        },
      }),
    )
    expect(outcome).toMatchObject({ kind: 'retryable_failure', reason: 'error' })
    expect(await paymentsFor(db.pool, key)).toBe(0)
  })
})

describe('6. in flight', () => {
  it('answers in_progress promptly, without queueing behind the first', async () => {
    const { engine, events } = engineFor(db.pool, { leaseMs: 10_000 })
    const key = freshKey()
    const release = gate()
    const held = running(async (ctx: ExecutionContext) => {
      const result = await pay(key)(ctx) // holds row locks in the open transaction
      await release.opened
      return result
    })
    const calledAt = Date.now()
    const first = engine.execute(input(key, { handler: held.handler }))
    await held.started
    const second = await engine.execute(input(key))
    const ranAtMostMs = Date.now() - calledAt
    expect(second.kind).toBe('in_progress')
    if (second.kind !== 'in_progress') return
    // Nothing is known of how long this operation takes: ask again in a second, or as long again as the holder has
    // run when that is longer (a loaded machine can take over a second to get here).
    expect(second.retryAfterMs).toBeGreaterThanOrEqual(1_000)
    expect(second.retryAfterMs).toBeLessThanOrEqual(Math.max(1_000, ranAtMostMs + 1))
    expect(events.some((e) => e.type === 'in_progress')).toBe(true)
    release.open()
    expect((await first).kind).toBe('executed')
  })

  it('answers replays and 409s without waiting on a lock held on the key row (regression: ON CONFLICT DO UPDATE locked it)', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
    const done = freshKey()
    const busy = freshKey()
    await engine.execute(input(done))
    const release = gate()
    const held = running(async () => {
      await release.opened
      return { status: 201 }
    })
    const first = engine.execute(input(busy, { handler: held.handler }))
    await held.started
    const locker = await db.pool.connect()
    try {
      await locker.query('BEGIN')
      // One tenant's rows: on Citus a FOR UPDATE must stay within one shard.
      await locker.query(
        `SELECT 1 FROM oncely.idempotency_keys WHERE scope = 'tenant' AND key IN ($1, $2) FOR UPDATE`,
        [done, busy],
      )
      const answers = Promise.all([engine.execute(input(done)), engine.execute(input(busy))])
      const result = await Promise.race([answers, sleep(3_000).then(() => 'blocked' as const)])
      expect(result).not.toBe('blocked')
      if (result === 'blocked') return
      expect(result.map((o) => o.kind)).toEqual(['replayed', 'in_progress'])
    } finally {
      await locker.query('ROLLBACK')
      locker.release()
      release.open()
      await first
    }
  })

  it('waits for the first attempt when asked, and returns its response', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const slow = running(async (ctx: ExecutionContext) => {
      await sleep(300)
      return pay(key)(ctx)
    })
    const first = engine.execute(input(key, { handler: slow.handler }))
    await slow.started
    const second = await engine.execute(input(key, { wait: { timeoutMs: 5_000 } }))
    const done = await first
    expect(second.kind).toBe('replayed')
    if (second.kind !== 'replayed' || done.kind !== 'executed') return
    expect(second.response.body.equals(done.response.body)).toBe(true)
  })
})

describe('7. crashes and pauses', () => {
  it('gives the key to the next attempt after a crash: the row protocol once the lease ran out, the lock protocol at once', async () => {
    const key = freshKey()
    const crash = new Error('crash after the reservation')
    // Long enough that a loaded machine cannot outlast it between the crash and the check that the key is held (a
    // rollback, then a reservation).
    const leaseMs = 2_000
    const crashing = engineFor(db.pool, {
      leaseMs,
      hooks: {
        afterReserve: () => {
          throw crash
        },
      },
    })
    await expect(crashing.engine.execute(input(key))).rejects.toBe(crash)
    const { engine, events } = engineFor(db.pool, { leaseMs })
    if (row) {
      expect(await engine.execute(input(key))).toMatchObject({ kind: 'in_progress' })
      await sleep(leaseMs + 50)
      expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed', attempt: 2 })
      expect(events.some((e) => e.type === 'takeover')).toBe(true)
    } else {
      expect(await record(key)).toBeUndefined()
      expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed', attempt: 1 })
    }
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it('ends an attempt whose process stalled past its lease: its writes roll back and it answers with the winner', async () => {
    const key = freshKey()
    const paused = gate()
    const reachedCommit = gate()
    // A lease of a second, so the attempt reaches its commit hook through a loaded machine's stalls (a shorter one
    // once ended it before, and the test waited for a hook that never ran); the hook then stalls past it.
    const slow = engineFor(db.pool, {
      leaseMs: 1_000,
      hooks: {
        beforeCommit: async () => {
          reachedCommit.open()
          stallEventLoop(1_100)
          await paused.opened
        },
      },
    })
    const original = slow.engine.execute(input(key, { handler: pay(`${key}-1`) }))
    await reachedCommit.opened
    // The winner's own lease is long: only the paused attempt's is meant to run out, however busy the machine.
    const { engine } = engineFor(db.pool, { leaseMs: 10_000 })
    const winner = await engine.execute(input(key, { handler: pay(`${key}-2`), wait: { timeoutMs: 5_000 } }))
    // Under the lock protocol the paused attempt's transaction was ended by Postgres and left no record behind.
    expect(winner).toMatchObject({ kind: 'executed', attempt: row ? 2 : 1 })
    paused.open()
    const late = await original
    expect(late).toMatchObject({ kind: 'replayed', fencedOut: true })
    if (late.kind !== 'replayed' || winner.kind !== 'executed') return
    expect(late.response.body.equals(winner.response.body)).toBe(true)
    expect(await paymentsFor(db.pool, `${key}-1`)).toBe(0)
    expect(await paymentsFor(db.pool, `${key}-2`)).toBe(1)
    expect(slow.events.some((e) => e.type === 'fenced_out')).toBe(true)
  })

  it('frees the key when the connection holding it dies mid-handler', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const killed = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key)(ctx)
          const { rows } = await ctx.tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')
          // ::int: Citus adds a pg_terminate_backend(bigint) for its global pids, so an untyped parameter is ambiguous.
          await db.pool.query('SELECT pg_terminate_backend($1::int)', [rows[0]!.pid])
          await ctx.tx.query('SELECT 1')
          return { status: 201, body: {} }
        },
      }),
    )
    expect(killed).toMatchObject({ kind: 'retryable_failure', reason: 'error' })
    // The retry waits out a 409, as a client would: on Citus the key's lock lives in the worker's session, which ends
    // only once the worker sees the coordinator's connection close, a moment after the kill on a busy machine.
    expect(await engine.execute({ ...input(key), wait: { timeoutMs: 10_000 } })).toMatchObject({
      kind: 'executed',
    })
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })
})

describe('8. failure semantics', () => {
  it('stores and replays a permanent failure (a thrown 4xx), with the business writes rolled back', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
    const key = freshKey()
    let runs = 0
    const handler = async (ctx: ExecutionContext) => {
      runs++
      await pay(key)(ctx)
      throw Object.assign(new Error('card declined'), { statusCode: 402, code: 'card_declined' })
    }
    const first = await engine.execute(input(key, { handler }))
    const second = await engine.execute(input(key, { handler }))
    expect(first).toMatchObject({ kind: 'executed', status: 'failed_permanent', response: { status: 402 } })
    expect(second).toMatchObject({ kind: 'replayed', response: { status: 402 } })
    if (first.kind !== 'executed' || second.kind !== 'replayed') return
    expect(JSON.parse(second.response.body.toString())).toMatchObject({
      statusCode: 402,
      code: 'card_declined',
    })
    expect(runs).toBe(1)
    expect((await record(key)).status).toBe('failed_permanent')
    expect(await paymentsFor(db.pool, key)).toBe(0)
  })

  // Regression: the chaos quick tier (row protocol, a database restart) saw a client answered with the handler's 422
  // while its key was left in progress: the store's connection broke, so the engine could not store the failure
  // and answered retryable, but with the handler's error, which the framework rendered as the final 4xx it reads as.
  it.skipIf(pooled)(
    'a permanent error thrown after the connection broke is answered with the store failure, and a retry stores it',
    async () => {
      const { engine } = engineFor(db.pool, { replayCache: false, leaseMs: 1_000 })
      const key = freshKey()
      const declined = Object.assign(new Error('card declined'), { statusCode: 402 })
      let runs = 0
      const handler = async (ctx: ExecutionContext) => {
        runs++
        if (runs === 1) {
          const { rows } = await ctx.tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')
          await db.pool.query('SELECT pg_terminate_backend($1)', [rows[0]!.pid])
        }
        throw declined
      }
      const first = await engine.execute(input(key, { handler }))
      expect(first).toMatchObject({ kind: 'retryable_failure', reason: 'error' })
      if (first.kind !== 'retryable_failure') return
      expect(first.error).not.toBe(declined)
      // The key is freed, or held until its lease runs out: the client's retry stores the failure.
      const retried = await engine.execute(input(key, { handler, wait: { timeoutMs: 5_000 } }))
      expect(retried).toMatchObject({
        kind: 'executed',
        status: 'failed_permanent',
        response: { status: 402 },
      })
      expect((await record(key)).status).toBe('failed_permanent')
    },
  )

  it('stores a returned 4xx as failed_permanent', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const handler = async () => ({ status: 402, body: { code: 'card_declined' } })
    await engine.execute(input(key, { handler }))
    expect(await engine.execute(input(key, { handler }))).toMatchObject({
      kind: 'replayed',
      response: { status: 402 },
    })
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
      if (++runs === 1) {
        await pay(key)(ctx)
        throw error
      }
      return pay(key)(ctx)
    }
    expect(await engine.execute(input(key, { handler }))).toMatchObject({
      kind: 'retryable_failure',
      reason: 'error',
      error,
    })
    expect(events.some((e) => e.type === 'released')).toBe(true)
    // `attempt` counts attempts that left a record: the lock protocol's failed attempt left none.
    expect(await engine.execute(input(key, { handler }))).toMatchObject({
      kind: 'executed',
      attempt: row ? 2 : 1,
    })
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it('does not store a returned 5xx and rolls back its writes', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const outcome = await engine.execute(
      input(key, {
        handler: async (ctx) => {
          await pay(key)(ctx)
          return { status: 502, body: 'bad gateway' }
        },
      }),
    )
    expect(outcome).toMatchObject({ kind: 'retryable_failure', reason: 'server_error_response' })
    expect(await paymentsFor(db.pool, key)).toBe(0)
    expect((await engine.execute(input(key))).kind).toBe('executed')
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it.each([408, 409, 425, 429])(
    'releases the key after a thrown %i (a "not now" that clients retry), storing nothing',
    async (statusCode) => {
      const { engine } = engineFor(db.pool, { replayCache: false })
      const key = freshKey()
      let runs = 0
      const handler = async (ctx: ExecutionContext) => {
        if (++runs === 1) throw Object.assign(new Error('not now'), { statusCode })
        return pay(key)(ctx)
      }
      expect(await engine.execute(input(key, { handler }))).toMatchObject({
        kind: 'retryable_failure',
        reason: 'error',
      })
      expect(await engine.execute(input(key, { handler }))).toMatchObject({
        kind: 'executed',
        status: 'succeeded',
      })
      expect(await paymentsFor(db.pool, key)).toBe(1)
    },
  )

  it('releases the key after a thrown 4xx that carries Retry-After (http-errors style headers)', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
    const key = freshKey()
    const error = Object.assign(new Error('locked for maintenance'), {
      statusCode: 403,
      headers: { 'Retry-After': '30' },
    })
    expect(
      await engine.execute(
        input(key, {
          handler: async () => {
            throw error
          },
        }),
      ),
    ).toMatchObject({ kind: 'retryable_failure', reason: 'error', error })
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed' })
  })

  it.each([408, 409, 425, 429])(
    'does not store a returned %i: the response is sent, the key released',
    async (status) => {
      const { engine } = engineFor(db.pool, { replayCache: false })
      const key = freshKey()
      const outcome = await engine.execute(
        input(key, {
          handler: async (ctx) => {
            await pay(key)(ctx)
            return { status, headers: { 'retry-after': '2' }, body: { retry: true } }
          },
        }),
      )
      expect(outcome).toMatchObject({
        kind: 'retryable_failure',
        reason: 'retryable_response',
        response: { status },
      })
      expect(await paymentsFor(db.pool, key)).toBe(0)
      expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed' })
    },
  )

  it('does not store a returned 4xx with Retry-After, but stores a success with one (a 202 naming when to poll)', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
    const refused = freshKey()
    const handler = (status: number) => async () => ({ status, headers: { 'Retry-After': '5' }, body: {} })
    expect(await engine.execute(input(refused, { handler: handler(403) }))).toMatchObject({
      kind: 'retryable_failure',
      reason: 'retryable_response',
    })
    const accepted = freshKey()
    expect(await engine.execute(input(accepted, { handler: handler(202) }))).toMatchObject({
      kind: 'executed',
    })
    expect(await engine.execute(input(accepted, { handler: handler(202) }))).toMatchObject({
      kind: 'replayed',
    })
  })

  it('lets the caller override the classification', async () => {
    const { engine } = engineFor(db.pool)
    const outcome = await engine.execute(
      input(freshKey(), {
        classify: () => 'permanent',
        renderError: () => ({ status: 409, body: { code: 'already_refunded' } }),
        handler: async () => {
          throw new Error('already refunded')
        },
      }),
    )
    expect(outcome).toMatchObject({ kind: 'executed', status: 'failed_permanent', response: { status: 409 } })
  })
})

describe('9. replay', () => {
  it('replays exact status, body bytes and allowlisted headers only', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
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
    await engine.execute(input(key, { handler }))
    const replay = await engine.execute(input(key, { handler }))
    expect(replay.kind).toBe('replayed')
    if (replay.kind !== 'replayed') return
    expect(replay.response.status).toBe(202)
    expect(replay.response.body.equals(body)).toBe(true)
    expect(replay.response.headers).toEqual({ 'content-type': 'application/octet-stream', etag: '"v1"' })
  })

  it('stores hostile keys and large bodies byte for byte, with and without prepared statements', async () => {
    // Behind a transaction-mode pooler only unnamed statements work (see pooler.test.ts for what happens otherwise).
    for (const preparedStatements of pooled ? [false] : [true, false]) {
      const engine = createEngine({
        store: postgresStore({ pool: db.pool, preparedStatements }),
        reservation,
        replayCache: false,
      })
      const key = `${freshKey()}'; DROP TABLE payments; -- \\' \\\\ "`
      for (const body of [{ small: "it's" }, { big: Buffer.alloc(100_000, 'x').toString() }]) {
        const k = `${key}-${Object.keys(body)[0]}`
        const first = await engine.execute(input(k, { handler: pay(k, body) }))
        expect(first).toMatchObject({ kind: 'executed' })
        const replay = await engine.execute(input(k))
        expect(replay.kind).toBe('replayed')
        if (first.kind === 'executed' && replay.kind === 'replayed') {
          expect(replay.response.body.equals(first.response.body)).toBe(true)
        }
        expect(await paymentsFor(db.pool, k)).toBe(1)
      }
    }
  })

  it('refuses set-cookie in the replay allowlist', () => {
    expect(() => engineFor(db.pool, { replayHeaders: ['location', 'Set-Cookie'] })).toThrow(/replayHeaders/)
  })

  it('stores a response over maxResponseBytes as a response_too_large failure: writes rolled back, the handler never runs again', async () => {
    const { engine } = engineFor(db.pool, { maxResponseBytes: 10, replayCache: false })
    const key = freshKey()
    let runs = 0
    const tooLarge = input(key, {
      handler: async (ctx) => {
        runs++
        await pay(key)(ctx)
        return { status: 201, body: 'x'.repeat(11) }
      },
    })
    const outcome = await engine.execute(tooLarge)
    expect(outcome).toMatchObject({ kind: 'executed', status: 'failed_permanent', response: { status: 500 } })
    if (outcome.kind !== 'executed') return
    expect(outcome.tooLarge).toMatchObject({ name: 'ResponseTooLargeError', size: 11, limit: 10 })
    expect(JSON.parse(outcome.response.body.toString())).toMatchObject({ code: 'response_too_large' })
    expect(await paymentsFor(db.pool, key)).toBe(0)
    expect((await record(key))?.status).toBe('failed_permanent')
    // The retry replays the stored problem: a handler whose external calls happened is not run a second time.
    const retry = await engine.execute(tooLarge)
    expect(retry).toMatchObject({ kind: 'replayed', response: { status: 500 } })
    expect(runs).toBe(1)
  })
})

describe('10. peek and forget', () => {
  it('peeks without running or reserving: null while free, the replay once finished, 409 while held', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
    const key = freshKey()
    expect(await engine.peek(input(key))).toBeNull()
    expect(await record(key)).toBeUndefined()
    const release = gate()
    const held = running(async (ctx: ExecutionContext) => {
      await release.opened
      return pay(key)(ctx)
    })
    const first = engine.execute(input(key, { handler: held.handler }))
    try {
      await held.started
      expect(await engine.peek(input(key))).toMatchObject({ kind: 'in_progress' })
    } finally {
      release.open() // even when the peek failed, so no transaction is left open for the tests after this one
    }
    const done = await first
    const peeked = await engine.peek(input(key))
    expect(peeked).toMatchObject({ kind: 'replayed', fencedOut: false })
    if (peeked?.kind === 'replayed' && done.kind === 'executed') {
      expect(peeked.response.body.equals(done.response.body)).toBe(true)
    }
    expect(await engine.peek(input(key, { fingerprint: fingerprintOf('other') }))).toEqual({
      kind: 'mismatch',
    })
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it('never makes a real attempt lose its key: an execute among a crowd of peeks still runs (regression: a probe took the lock)', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
    const outcomes: string[] = []
    for (let round = 0; round < 30; round++) {
      const key = freshKey()
      let done = false
      // Peeks that never stop until the execute answered, from several connections at once.
      const peeking = Array.from({ length: 16 }, async () => {
        while (!done) await engine.peek(input(key))
      })
      await sleep(20)
      const executed = await engine.execute(input(key))
      done = true
      await Promise.all(peeking)
      outcomes.push(executed.kind)
    }
    expect(outcomes).toEqual(Array(30).fill('executed'))
  })

  it('forgets a finished key, so the next request with it runs again (this instance forgets its cached replay too)', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    expect(await engine.execute(input(key, { handler: pay(`${key}-1`) }))).toMatchObject({ kind: 'executed' })
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'replayed' })
    expect(await engine.forget({ scope: 'tenant', operation: op, key })).toBe(true)
    expect(await record(key)).toBeUndefined()
    // The replay's transaction may still hold the key's lock for a moment (its ROLLBACK follows its answer).
    await keyFree(engine, input(key))
    expect(await engine.execute(input(key, { handler: pay(`${key}-2`) }))).toMatchObject({
      kind: 'executed',
      attempt: 1,
    })
    expect(await paymentsFor(db.pool, `${key}-2`)).toBe(1)
    expect(await engine.forget({ scope: 'tenant', operation: op, key: freshKey() })).toBe(false)
    await expect(engine.forget({ scope: '', operation: op, key })).rejects.toThrow('Expected `scope`')
  })
})

describe('12. retention', () => {
  it('treats an expired key as new, whatever its fingerprint', async () => {
    const { engine, events } = engineFor(db.pool, { replayCache: false })
    const key = freshKey()
    await engine.execute(input(key, { fingerprint: 'f1', handler: pay(`${key}-1`) }))
    await db.pool.query(
      `UPDATE oncely.idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`,
      [key],
    )
    const again = await engine.execute(input(key, { fingerprint: 'f2', handler: pay(`${key}-2`) }))
    expect(again).toMatchObject({ kind: 'executed', attempt: 1 })
    expect(events.some((e) => e.type === 'expired')).toBe(true)
    expect((await record(key)).fingerprint).toBe('f2')
    expect(await paymentsFor(db.pool, `${key}-2`)).toBe(1)
  })

  it('keeps a finished key for retentionMs from its creation', async () => {
    // A lease that a loaded machine cannot outrun between two statements, and a retention a test can wait out.
    const { engine } = engineFor(db.pool, { leaseMs: 2_000, retentionMs: 2_500, replayCache: false })
    const key = freshKey()
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'executed' })
    expect(await engine.execute(input(key))).toMatchObject({ kind: 'replayed' })
    await sleep(2_600)
    expect(await engine.execute(input(key, { handler: pay(`${key}-again`) }))).toMatchObject({
      kind: 'executed',
    })
  })
})

describe('12b. the reaper', () => {
  it('deletes expired rows in bounded batches, with several reapers at once', async () => {
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
  const missing = () =>
    postgresStore({ pool: db.pool, schema: 'no_such_schema', preparedStatements: !pooled })

  it('fails closed: no handler run, unavailable with a retry hint', async () => {
    const events: string[] = []
    const engine = createEngine({ store: missing(), reservation, onEvent: (e) => events.push(e.type) })
    let runs = 0
    const outcome = await engine.execute(
      input(freshKey(), {
        handler: async () => {
          runs++
          return { status: 200 }
        },
      }),
    )
    expect(outcome).toMatchObject({ kind: 'unavailable', retryAfterMs: 1_000 })
    expect(runs).toBe(0)
    expect(events).toContain('store_error')
  })

  it('fails open only when asked: the handler commits in a plain transaction, with no key record', async () => {
    const engine = createEngine({ store: missing(), reservation })
    const key = freshKey()
    const outcome = await engine.execute(input(key, { failOpen: true }))
    expect(outcome).toMatchObject({ kind: 'executed', failedOpen: true, status: 'succeeded' })
    expect(await paymentsFor(db.pool, key)).toBe(1)
    const failed = await engine.execute(
      input(freshKey(), {
        failOpen: true,
        handler: async (ctx) => {
          await pay(`${key}-x`)(ctx)
          throw new Error('provider down')
        },
      }),
    )
    expect(failed).toMatchObject({ kind: 'retryable_failure', reason: 'error' })
    expect(await paymentsFor(db.pool, `${key}-x`)).toBe(0)
  })
})

describe('14. natural-key backstop', () => {
  it('maps a unique violation on the business constraint to the existing resource', async () => {
    const { engine } = engineFor(db.pool)
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
    const first = await engine.execute(input(freshKey(), { handler }))
    // The key expired (or the client lost it): a very late retry arrives as a new request with a new key.
    const late = await engine.execute(input(freshKey(), { handler }))
    expect(first).toMatchObject({ kind: 'executed', response: { status: 201 } })
    expect(late).toMatchObject({ kind: 'executed', response: { status: 200 } })
    if (first.kind !== 'executed' || late.kind !== 'executed') return
    expect(late.response.body.toString()).toBe(first.response.body.toString())
    const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM orders WHERE cart = $1', [cart])
    expect(rows[0].n).toBe(1)
  })

  it('rethrows violations of other constraints', async () => {
    const client = await db.pool.connect()
    try {
      await client.query('BEGIN')
      const id = 900_000 + Math.floor(Math.random() * 99_999)
      await client.query(`INSERT INTO orders (id, tenant, cart) VALUES ($1, 'x', 'y')`, [id])
      await expect(
        insertOrExisting(client, {
          constraint: 'orders_cart_key',
          insert: (tx) => tx.query(`INSERT INTO orders (id, tenant, cart) VALUES ($1, 'x', 'z')`, [id]),
          existing: async () => undefined,
        }),
      ).rejects.toMatchObject(
        // Citus relays the worker's error without its constraint field; the message names the shard's constraint.
        onCitus
          ? { code: '23505', message: expect.stringMatching(/"orders_pkey_\d+"/) }
          : { code: '23505', constraint: 'orders_pkey' },
      )
    } finally {
      await client.query('ROLLBACK')
      client.release()
    }
  })
})

describe('15. steps and recovery points', () => {
  it('derives deterministic step keys and keeps the recovery point for the next attempt', async () => {
    const { engine } = engineFor(db.pool)
    const key = freshKey()
    const seen: Array<{ point: string | null; charge: string }> = []
    const handler = async (ctx: ExecutionContext) => {
      seen.push({ point: ctx.recoveryPoint, charge: ctx.stepKey('charge') })
      if (seen.length === 1) {
        expect(await ctx.saveRecoveryPoint('charged')).toBe(true)
        throw new Error('crashed after the charge')
      }
      return pay(key)(ctx)
    }
    await engine.execute(input(key, { handler }))
    expect(await engine.execute(input(key, { handler }))).toMatchObject({ kind: 'executed', attempt: 2 })
    expect(seen).toHaveLength(2)
    expect(seen[1]).toEqual({ point: 'charged', charge: seen[0]?.charge })
    expect(seen[0]?.charge).toMatch(/^[0-9a-f]{64}$/)
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })
})

describe('16. resources', () => {
  it('leaves no connection, transaction or lock behind, whatever the answer', async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 2 })
    pool.on('error', () => {})
    try {
      const engine = createEngine({
        store: postgresStore({ pool, preparedStatements: !pooled }),
        reservation,
      })
      for (let i = 0; i < 20; i++) {
        const key = freshKey()
        await engine.execute(input(key))
        await engine.execute(input(key))
        await engine.execute(input(key, { fingerprint: fingerprintOf('x') }))
        await engine.execute(input(freshKey(), { handler: async () => ({ status: 503 }) }))
        await engine.execute(
          input(freshKey(), {
            handler: async () => {
              throw Object.assign(new Error('declined'), { statusCode: 402 })
            },
          }),
        )
      }
      // A transaction's ROLLBACK may follow its answer (a replay, a mismatch): wait until every connection is back in
      // the pool, so each transaction ended, before looking for what they left behind.
      await waitFor('every connection back in the pool', () => pool.idleCount === pool.totalCount, 5_000)
      // On Citus, on every node: the key's locks and the worker side of each transaction are on the workers.
      const everywhere = async (sql: string) =>
        onCitus
          ? (
              await db.pool.query<{ n: number }>(
                // A node that could not answer counts as a leftover.
                'SELECT sum(CASE WHEN success THEN result::int ELSE 1000 END)::int AS n FROM run_command_on_all_nodes($1)',
                [sql],
              )
            ).rows[0]!.n
          : (await db.pool.query<{ n: number }>(sql)).rows[0]!.n
      expect(
        await everywhere(
          // Advisory locks taken by SQL (objsubid 1 and 2), not the ones Citus takes for itself with its classes.
          `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objsubid IN (1, 2) AND database =
             (SELECT oid FROM pg_database WHERE datname = current_database())`,
        ),
      ).toBe(0)
      expect(
        await everywhere(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in%'`,
        ),
      ).toBe(0)
      expect(pool.idleCount).toBe(pool.totalCount)
    } finally {
      await pool.end()
    }
  })
})

describe('options', () => {
  it('names the bad option', () => {
    expect(() => engineFor(db.pool, { leaseMs: -1 })).toThrow('Expected `leaseMs` to be a positive integer')
    expect(() => engineFor(db.pool, { leaseMs: 10_000, retentionMs: 5_000 })).toThrow(/retentionMs/)
    expect(() => engineFor(db.pool, { replayCache: { maxAgeMs: 0 } })).toThrow('`replayCache.maxAgeMs`')
    expect(() => engineFor(db.pool, { replayHeaders: 'location' as never })).toThrow(
      "Expected `replayHeaders` to be an array of header names, such as ['X-Request-Id'].",
    )
    expect(() => engineFor(db.pool, { onEvent: 'log' as never })).toThrow(
      'Expected `onEvent` to be a function.',
    )
    expect(() => postgresStore({ pool: db.pool, table: '' })).toThrow('Expected `table`')
    expect(() =>
      createEngine({ store: postgresStore({ pool: db.pool }), hooks: {} } as unknown as Parameters<
        typeof createEngine
      >[0]),
    ).toThrow(
      "`hooks` is not an option of createEngine(): fault injection is for tests, through createEngineForTesting() from '@oncely/server/testing'.",
    )
  })

  it('reports the resolved options', () => {
    expect(engineFor(db.pool, { leaseMs: 5_000 }).engine.options).toEqual({
      leaseMs: 5_000,
      retentionMs: 86_400_000,
      maxResponseBytes: 1_048_576,
      reservation,
    })
  })
})
