// The datasource contract: what every datasource must hold, whatever its library, under both reservation protocols
// (vitest.config.ts runs this file once per datasource and protocol). Every effect is written and counted through
// the library itself (registry.ts), in the handler's own transaction object, so a datasource whose `ctx.tx` were not
// the transaction that also completes the key would fail here: run with ONCELY_TEST_SABOTAGE=second-connection to
// see the suite fail when the writes go through a second connection of the same library.
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { createInterface } from 'node:readline'
import { serve } from '@hono/node-server'
import { createTestDatabase, spawnTsx, type TestDatabase } from '@oncely/test-support'
import express from 'express'
import Fastify from 'fastify'
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest'
import { idempotency as expressIdempotency } from '../../src/express/index.js'
import { fastifyIdempotency } from '../../src/fastify/index.js'
import { idempotency as fetchIdempotency } from '../../src/fetch/index.js'
import { createInbox } from '../../src/inbox/index.js'
import { type Engine, type ExecuteInput, insertOrExisting, migrate, postgresStore } from '../../src/index.js'
import { enqueue } from '../../src/outbox/index.js'
import { steps } from '../../src/steps/index.js'
import { createEngineForTesting, type TestingEngineOptions } from '../../src/testing/index.js'
import { listening } from '../adapters/servers.js'
import { fingerprintOf, freshKey, gate, reservation, running, sleep, stallEventLoop } from '../helpers.js'
import { type DatasourceUnderTest, datasourceName, oneConnection, openDatasource } from './registry.js'

let db: TestDatabase
let ds: DatasourceUnderTest
// A datasource of one connection (PGlite) runs every transaction after the one before it. The cases that need a
// second connection, or a second process on the same database, are left out under it, each saying why; the one
// that sends a duplicate while the first attempt holds its key expects the duplicate to wait and replay.
const single = oneConnection.has(datasourceName)
beforeAll(async () => {
  db = await createTestDatabase(`datasource_${datasourceName}`)
  ds = await openDatasource(db.url)
  // Through the datasource: a library in the process (PGlite) has a database of its own.
  const sql = (text: string) => ds.database.query({ text, values: [] })
  await migrate(ds.database)
  await sql(
    'CREATE TABLE payments (id bigserial PRIMARY KEY, tenant text NOT NULL, cart text NOT NULL, amount integer NOT NULL)',
  )
  await sql('CREATE TABLE orders (id bigserial PRIMARY KEY, cart text NOT NULL UNIQUE)')
  // Starting a library is CPU-bound (PGlite's WebAssembly Postgres, Prisma's engine): on a machine running two suites
  // at once it outlasted the default hook timeout. A bound on start-up, not on anything the contract asserts.
}, 180_000)
afterAll(async () => {
  await ds?.close()
  await db?.drop()
})

function engineWith(options: Partial<TestingEngineOptions<unknown>> = {}) {
  return createEngineForTesting<unknown>({
    store: postgresStore({ database: ds.database }),
    reservation,
    replayCache: false,
    ...options,
  })
}

type PaymentsServer = (engine: Engine<unknown>) => Promise<{ url: string; close(): Promise<void> }>

/** POST /v1/payments through each HTTP adapter, booking `{ cart }` in the route's own `tx`. */
const paymentServers: Record<string, PaymentsServer> = {
  async Fastify(engine) {
    const app = Fastify()
    await app.register(fastifyIdempotency, { engine, tenant: () => 't' })
    app.post('/v1/payments', { config: { idempotency: true } }, async (req) => {
      const { cart } = req.body as { cart: string }
      await ds.pay(req.idempotency.tx, cart)
      return { cart }
    })
    return { url: await app.listen({ port: 0, host: '127.0.0.1' }), close: () => app.close() }
  },
  Express(engine) {
    const idempotent = expressIdempotency({ engine, tenant: () => 't' })
    const app = express()
    app.post(
      '/v1/payments',
      idempotent(async (req, res) => {
        const { cart } = req.body as { cart: string }
        await ds.pay(req.idempotency.tx, cart)
        res.json({ cart })
      }),
    )
    return listening(app.listen(0, '127.0.0.1'))
  },
  Fetch(engine) {
    const idempotent = fetchIdempotency({ engine, tenant: () => 't' })
    const handler = idempotent(async (_request, { body, idempotency }) => {
      const { cart } = body as { cart: string }
      await ds.pay(idempotency.tx, cart)
      return Response.json({ cart })
    })
    return listening(serve({ fetch: handler, port: 0, hostname: '127.0.0.1' }))
  },
}

const request = (key: string, handler: ExecuteInput<unknown>['handler']): ExecuteInput<unknown> => ({
  scope: 'tenant',
  operation: 'POST /v1/payments',
  key,
  fingerprint: fingerprintOf({ key }),
  handler,
})

const paying =
  (cart: string): ExecuteInput<unknown>['handler'] =>
  async (ctx) => {
    await ds.pay(ctx.tx, cart)
    return { status: 201, body: { cart } }
  }

describe(`datasource ${datasourceName} (reservation: '${reservation}')`, () => {
  it('a first execution commits its write with the key; the retry replays, one row', async () => {
    const engine = engineWith()
    const key = freshKey()
    expect(await engine.execute(request(key, paying(key)))).toMatchObject({
      kind: 'executed',
      status: 'succeeded',
    })
    expect(await engine.execute(request(key, paying(key)))).toMatchObject({ kind: 'replayed' })
    expect(await ds.payments(key)).toBe(1)
  })

  it('a handler that writes and throws leaves no row and a retryable key', async () => {
    const engine = engineWith()
    const key = freshKey()
    const failing = await engine.execute(
      request(key, async (ctx) => {
        await ds.pay(ctx.tx, key)
        throw new Error('provider timeout')
      }),
    )
    expect(failing).toMatchObject({ kind: 'retryable_failure' })
    expect(await ds.payments(key)).toBe(0)
    expect(await engine.execute(request(key, paying(key)))).toMatchObject({ kind: 'executed' })
    expect(await ds.payments(key)).toBe(1)
  })

  it('a thrown 4xx is stored and replayed, its write rolled back', async () => {
    const engine = engineWith()
    const key = freshKey()
    const declined = async (ctx: { tx: unknown }) => {
      await ds.pay(ctx.tx, key)
      throw Object.assign(new Error('card declined'), { statusCode: 402 })
    }
    expect(await engine.execute(request(key, declined))).toMatchObject({
      kind: 'executed',
      status: 'failed_permanent',
    })
    expect(await engine.execute(request(key, declined))).toMatchObject({
      kind: 'replayed',
      response: { status: 402 },
    })
    expect(await ds.payments(key)).toBe(0)
  })

  it('concurrent duplicates execute once', async () => {
    const engine = engineWith()
    const key = freshKey()
    let runs = 0
    const handler: ExecuteInput<unknown>['handler'] = async (ctx) => {
      runs++
      await sleep(50)
      return paying(key)(ctx)
    }
    const outcomes = await Promise.all(
      Array.from({ length: 10 }, () => engine.execute(request(key, handler))),
    )
    expect(outcomes.filter((o) => o.kind === 'executed')).toHaveLength(1)
    expect(runs).toBe(1)
    expect(await ds.payments(key)).toBe(1)
  })

  it('a live handler idle in its transaction for twice the lease keeps its key and completes once', async () => {
    // A lease of a second: its keep-alive every third of it may come late by two thirds before the key is lost. With
    // 600 ms, a renewal that waited over 400 ms on a machine running two suites let the duplicate take the key.
    const leaseMs = 1_000
    const engine = engineWith({ leaseMs })
    const key = freshKey()
    // Held until the duplicate has its answer too: finished first, the attempt would rightly be replayed to it. (On
    // one connection the duplicate waits for this attempt instead.)
    const answered = gate()
    const slow = running(async (ctx: { tx: unknown }) => {
      await ds.pay(ctx.tx, key)
      await Promise.all([sleep(2 * leaseMs + 200), single ? undefined : answered.opened])
      return { status: 201, body: {} }
    })
    const first = engine.execute(request(key, slow.handler))
    await slow.started
    await sleep(leaseMs + 200)
    // On one connection the duplicate cannot look while the first attempt's transaction holds it: it waits, then
    // replays the answer.
    const duplicate = await engine.execute(request(key, paying(key)))
    answered.open()
    expect(duplicate).toMatchObject({ kind: single ? 'replayed' : 'in_progress' })
    expect(await first).toMatchObject({ kind: 'executed' })
    expect(await ds.payments(key)).toBe(1)
  })

  // Left out on one connection: the database runs in the stalled process and on the connection the stalled attempt
  // holds, so no other attempt can run meanwhile, and there is no takeover to show.
  it.skipIf(single)(
    'an attempt whose process stalled past its lease is rolled back and answers with the winner',
    async () => {
      const key = freshKey()
      let stall = true
      const engine = engineWith({
        leaseMs: 300,
        hooks: {
          beforeCommit: () => {
            if (!stall) return
            stall = false
            // Over three leases: Postgres must have ended the idle transaction when the process wakes, even when a
            // loaded machine runs its timeout late (a finish that reached a live transaction would rightly commit).
            stallEventLoop(1_000)
          },
        },
      })
      // The duplicate starts once the original holds the key (a fixed sleep let a slow first connection lose the
      // race, and the duplicate then ran the stalling attempt itself).
      const holding = running(paying(key))
      const original = engine.execute(request(key, holding.handler))
      await holding.started
      // The winner's own lease is long: only the stalled attempt's is meant to run out, however busy the machine.
      const winner = await engineWith({ leaseMs: 10_000 }).execute({
        ...request(key, paying(key)),
        wait: { timeoutMs: 10_000 },
      })
      const late = await original
      expect(winner).toMatchObject({ kind: 'executed' })
      expect(['lease_expired', 'replayed']).toContain(late.kind)
      expect(await ds.payments(key)).toBe(1)
    },
  )

  // Left out on one connection, as above. Regression: a library that rolls back through its own transaction callback
  // (Prisma, Knex, ...) reports no error for a transaction Postgres already ended, so an attempt whose handler the
  // stall aborted was answered as an ordinary retryable failure, and the stall went unreported.
  it.skipIf(single)(
    'an attempt whose handler a stall past its lease aborted answers lease_expired, its writes rolled back',
    async () => {
      const key = freshKey()
      const engine = engineWith({ leaseMs: 300 })
      const outcome = await engine.execute(
        request(key, async (ctx: { tx: unknown; signal: AbortSignal }) => {
          await ds.pay(ctx.tx, key)
          // Over three leases: Postgres ends the idle transaction meanwhile. The keep-alive due during the stall runs
          // once the process wakes, sees it, and aborts the attempt; the handler honours its signal.
          stallEventLoop(1_000)
          if (!ctx.signal.aborted)
            await new Promise((aborted) => ctx.signal.addEventListener('abort', aborted, { once: true }))
          throw ctx.signal.reason
        }),
      )
      expect(outcome).toMatchObject({ kind: 'lease_expired' })
      expect(await ds.payments(key)).toBe(0)
      expect(await engine.execute(request(key, paying(key)))).toMatchObject({ kind: 'executed' })
      expect(await ds.payments(key)).toBe(1)
    },
  )

  // Left out on one connection: nothing besides the attempt's own connection could end it.
  // Regression: postgres.js 3.4 never settles a statement of a transaction that waited behind another one in flight
  // when Postgres closes the connection, so the attempt's finish waited for ever and its request was never answered
  // (the chaos suite's stalled attempts met it: Postgres ends the transaction of a holder idle past its lease).
  it.skipIf(single)(
    'an attempt whose connection is lost while its finish waits behind a statement in flight is answered',
    async () => {
      const engine = engineWith()
      const key = freshKey()
      const handler = async (ctx: { tx: unknown }) => {
        await ds.pay(ctx.tx, key)
        const pid = (
          await ds.database.execute<{ pid: number }>(ctx.tx, {
            text: 'SELECT pg_backend_pid() AS pid',
            values: [],
          })
        ).rows[0]!.pid
        // A statement left running on the transaction (a parameter, so postgres.js describes it first and queues
        // what follows), and the connection terminated while it runs: the finish is queued behind it.
        ds.database.execute(ctx.tx, { text: 'SELECT pg_sleep($1::float8)', values: [5] }).catch(() => {})
        setTimeout(() => {
          void ds.second.query({ text: 'SELECT pg_terminate_backend($1::int)', values: [pid] })
        }, 300)
        return { status: 201, body: { cart: key } }
      }
      const answered = await Promise.race([
        engine.execute(request(key, handler)),
        sleep(20_000).then(() => 'never answered' as const),
      ])
      expect(answered).not.toBe('never answered')
      expect(answered).toMatchObject({ kind: expect.stringMatching(/^(unavailable|retryable_failure)$/) })
      // Nothing of it committed, and the key is free: the retry executes once.
      expect(await ds.payments(key)).toBe(0)
      expect(await engine.execute(request(key, paying(key)))).toMatchObject({ kind: 'executed' })
      expect(await ds.payments(key)).toBe(1)
    },
  )

  // Left out on one connection: a recovery point on the side lane and the steps' own transactions each need a
  // connection besides the one the attempt's transaction holds (steps() refuses the engine's own datasource, the
  // next case; the datasource refuses the side lane while a transaction is open: test/datasources/pglite.test.ts).
  it.skipIf(single)(
    'a recovery point saved on the side lane, then steps in transactions of their own, resume once',
    async () => {
      const engine = engineWith()
      const key = freshKey()
      let charges = 0
      const handler = steps<{ charged?: boolean }, unknown>({
        database: ds.second,
        steps: [
          {
            name: 'charge',
            run: async ({ tx }) => {
              charges++
              await ds.pay(tx, `${key}-step`)
              return { charged: true }
            },
          },
        ],
        finish: async ({ tx }) => {
          await ds.pay(tx, key)
          return { status: 201, body: {} }
        },
      })
      let crashed = false
      const crashing = createEngineForTesting<unknown>({
        store: postgresStore({ database: ds.database }),
        reservation,
        replayCache: false,
        // Long enough that a busy machine cannot end the attempt before its crash; the takeover below waits out
        // the lease its recovery point left.
        leaseMs: 2_000,
        hooks: {
          beforeCommit: () => {
            if (crashed) return
            crashed = true
            throw new Error('crash before the commit')
          },
        },
      })
      await expect(crashing.execute(request(key, handler))).rejects.toThrow('crash before the commit')
      expect(await engine.execute({ ...request(key, handler), wait: { timeoutMs: 10_000 } })).toMatchObject({
        kind: 'executed',
      })
      expect(charges).toBe(1)
      expect(await ds.payments(`${key}-step`)).toBe(1)
      expect(await ds.payments(key)).toBe(1)
    },
  )

  it("keeps Postgres's SQLSTATE as the error's code, on its own, in a transaction and on the side lane", async () => {
    const failing = { text: 'SELECT 1 / $1::int AS n', values: [0] }
    await expect(ds.database.query(failing)).rejects.toMatchObject({ code: '22012' })
    await expect(ds.database.side(failing)).rejects.toMatchObject({ code: '22012' })
    await expect(ds.database.transaction((tx) => ds.database.execute(tx, failing))).rejects.toMatchObject({
      code: '22012',
    })
  })

  it("steps refuse the engine's own datasource", async () => {
    const engine = engineWith()
    const handler = steps<object, unknown>({ database: ds.database, steps: [], finish: () => ({}) })
    const outcome = await engine.execute(request(freshKey(), handler))
    expect(outcome).toMatchObject({ kind: 'retryable_failure' })
  })

  it('an outbox message enqueued in the handler commits with it, or not at all', async () => {
    await migrate(ds.database) // the outbox table
    const engine = engineWith()
    const ok = freshKey()
    const failed = freshKey()
    await engine.execute(
      request(ok, async (ctx) => {
        await enqueue(ctx.tx, { topic: 'payments', payload: { key: ok } }, { database: ds.database })
        return { status: 201, body: {} }
      }),
    )
    await engine.execute(
      request(failed, async (ctx) => {
        await enqueue(ctx.tx, { topic: 'payments', payload: { key: failed } }, { database: ds.database })
        throw new Error('after the enqueue')
      }),
    )
    const { rows } = await ds.database.query({
      text: "SELECT payload->>'key' AS key FROM oncely.outbox WHERE payload->>'key' = ANY($1)",
      values: [[ok, failed]],
    })
    expect(rows.map((row) => row.key)).toEqual([ok])
  })

  it('insertOrExisting maps the business unique violation to the existing row, in the same transaction', async () => {
    const engine = engineWith()
    const cart = freshKey()
    const insertOrder = (key: string) =>
      engine.execute(
        request(key, async (ctx) => {
          const { created } = await insertOrExisting(ctx.tx, {
            constraint: 'orders_cart_key',
            database: ds.database,
            insert: (tx) =>
              ds.database.execute(tx, { text: 'INSERT INTO orders (cart) VALUES ($1)', values: [cart] }),
            existing: (tx) =>
              ds.database.execute(tx, { text: 'SELECT 1 FROM orders WHERE cart = $1', values: [cart] }),
          })
          await ds.pay(ctx.tx, cart)
          return { status: created ? 201 : 200, body: {} }
        }),
      )
    expect(await insertOrder(freshKey())).toMatchObject({ kind: 'executed', response: { status: 201 } })
    expect(await insertOrder(freshKey())).toMatchObject({ kind: 'executed', response: { status: 200 } })
    expect(await ds.payments(cart)).toBe(2)
  })

  // Each HTTP adapter hands the route the datasource's own transaction, typed as the engine's (no cast), over a real
  // socket: the write in it commits with the key, and the retry replays without running the route again.
  it.each(Object.keys(paymentServers))(
    "through the %s adapter: a write in the route's tx, replayed",
    async (adapter) => {
      const server = await paymentServers[adapter]?.(engineWith())
      if (!server) throw new Error(`no server for ${adapter}`)
      onTestFinished(() => server.close())
      const cart = freshKey()
      const post = () =>
        fetch(`${server.url}/v1/payments`, {
          method: 'POST',
          headers: { 'idempotency-key': cart, 'content-type': 'application/json' },
          body: JSON.stringify({ cart }),
        })
      const first = await post()
      expect(first.status).toBe(200)
      expect(await first.json()).toEqual({ cart })
      const replay = await post()
      expect(replay.headers.get('idempotent-replayed')).toBe('true')
      expect(await replay.json()).toEqual({ cart })
      expect(await ds.payments(cart)).toBe(1)
    },
  )

  it('the inbox applies a message once in its transaction; a failed delivery leaves nothing', async () => {
    const inbox = createInbox({ engine: engineWith(), consumer: 'billing', onEvent: () => {} })
    const messageId = freshKey()
    const deliver = (fail: boolean) =>
      inbox.consume({
        messageId,
        payload: { cart: messageId },
        handler: async ({ tx }) => {
          await ds.pay(tx, messageId)
          if (fail) throw new Error('after the write')
          return { cart: messageId }
        },
      })
    expect(await deliver(true)).toMatchObject({ kind: 'failed' })
    expect(await ds.payments(messageId)).toBe(0)
    expect(await deliver(false)).toMatchObject({ kind: 'processed', result: { cart: messageId } })
    expect(await deliver(false)).toMatchObject({ kind: 'duplicate', result: { cart: messageId } })
    expect(await ds.payments(messageId)).toBe(1)
  })

  // Left out on one connection: the database lives in the process (PGlite runs in it), so the killed process takes
  // its database with it, and another process cannot open the same data directory while this one has it open.
  it.skipIf(single)(
    'a process SIGKILLed mid-handler leaves no partial write; the retry executes once',
    async () => {
      const key = freshKey()
      const child = spawnTsx(new URL('fixtures/kill-mid-handler.ts', import.meta.url), [], {
        env: { ...process.env, DATABASE_URL: db.url, KEY: key },
        stdio: 'pipe',
      }) as ChildProcessWithoutNullStreams
      onTestFinished(() => {
        child.kill('SIGKILL')
      })
      const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]()
      expect((await lines.next()).value).toBe('holding')
      child.kill('SIGKILL')
      await new Promise((resolve) => child.once('exit', resolve))
      expect(await ds.payments(key)).toBe(0)
      const engine = engineWith({ leaseMs: 1_000 })
      expect(
        await engine.execute({ ...request(key, paying(key)), wait: { timeoutMs: 15_000 } }),
      ).toMatchObject({
        kind: 'executed',
      })
      expect(await ds.payments(key)).toBe(1)
    },
  )
})
