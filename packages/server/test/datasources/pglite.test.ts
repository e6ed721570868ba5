// What only the PGlite datasource raises: its one connection. Every transaction waits for the one before it, so the
// engine must queue and never wait for itself: a statement that would commit beside the open transaction is refused
// at once, no lease is renewed or guarded while the attempt holds the connection, and a stalled process still
// commits (no one could take its key meanwhile). The datasource contract runs under it too ('lock on pglite',
// 'row on pglite'); this file runs under both protocols.
import type { PGlite, Transaction } from '@electric-sql/pglite'
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest'
import { idempotency } from '../../src/fetch/index.js'
import { createEngine, type ExecuteInput, migrate, postgresStore } from '../../src/index.js'
import { pglite } from '../../src/pglite/index.js'
import { createEngineForTesting } from '../../src/testing/index.js'
import { fingerprintOf, freshKey, reservation, running, sleep, stallEventLoop } from '../helpers.js'
import { freshPGlite } from './fresh-pglite.js'

let db: PGlite
let applied: string[]
beforeAll(async () => {
  db = await freshPGlite()
  applied = (await migrate(pglite({ db }))).applied
  await db.exec('CREATE TABLE payments (id serial PRIMARY KEY, cart text NOT NULL)')
  // WebAssembly Postgres starts on the CPU: on a machine running two suites at once it outlasted the default timeout.
}, 180_000)
afterAll(() => db?.close())

const request = <Tx>(key: string, handler: ExecuteInput<Tx>['handler']): ExecuteInput<Tx> => ({
  scope: 'tenant',
  operation: 'POST /v1/payments',
  key,
  fingerprint: fingerprintOf({ key }),
  handler,
})

// What a duplicate sent while the first attempt runs gets. Under 'lock' it waits for the first attempt's transaction
// and replays its answer. Under 'row' the reservation commits in a transaction of its own before the business one
// begins, so a duplicate queued between the two finds the key in progress (409), as it would on any Postgres.
const duplicateKinds = reservation === 'row' ? ['replayed', 'in_progress'] : ['replayed']

const payments = async (cart: string) =>
  (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])).rows[0]
    ?.n

describe(`the PGlite datasource (reservation: '${reservation}')`, () => {
  it('migrate() creates the schema once, then finds nothing to do', async () => {
    const database = pglite({ db })
    expect(applied.length).toBeGreaterThan(0)
    expect(await migrate(database)).toEqual({ applied: [] })
    expect(pglite({ db })).toBe(database)
  })

  it('hands the handler PGlite’s own Transaction, typed as PGlite types it', async () => {
    const database = pglite({ db })
    const engine = createEngine({ store: postgresStore({ database }), reservation })
    const key = freshKey()
    const outcome = await engine.execute(
      request(key, async (ctx) => {
        expectTypeOf(ctx.tx).toEqualTypeOf<Transaction>()
        expect(database.isTransaction(ctx.tx)).toBe(true)
        await ctx.tx.query('INSERT INTO payments (cart) VALUES ($1)', [key])
        return { status: 201, body: {} }
      }),
    )
    expect(outcome).toMatchObject({ kind: 'executed' })
    expect(database.isTransaction(db)).toBe(false)
    expect(await payments(key)).toBe(1)
  })

  it('checks its options at construction', () => {
    expect(() => pglite(undefined as never)).toThrow(TypeError)
    expect(() => pglite({ db: {} as never })).toThrow(/`db`/)
  })

  it('queues requests on many keys at once on its one connection: each executes once, each duplicate replays', async () => {
    const engine = createEngine({ store: postgresStore({ database: pglite({ db }) }), reservation })
    const keys = Array.from({ length: 12 }, () => freshKey())
    const pay = (key: string) =>
      engine.execute(
        request<Transaction>(key, async (ctx) => {
          await ctx.tx.query('INSERT INTO payments (cart) VALUES ($1)', [key])
          await sleep(5)
          return { status: 201, body: {} }
        }),
      )
    const outcomes = await Promise.all(keys.flatMap((key) => [pay(key), pay(key)]))
    expect(outcomes.filter((o) => o.kind === 'executed')).toHaveLength(keys.length)
    const others = outcomes.filter((o) => o.kind !== 'executed')
    expect(others).toHaveLength(keys.length)
    for (const other of others) expect(duplicateKinds).toContain(other.kind)
    for (const key of keys) expect(await payments(key)).toBe(1)
  })

  it('refuses at once a recovery point that would commit beside the open transaction, which goes on', async () => {
    const database = pglite({ db })
    const engine = createEngine({ store: postgresStore({ database }), reservation })
    const key = freshKey()
    let refusal: unknown
    const outcome = await engine.execute(
      request<Transaction>(key, async (ctx) => {
        // Waiting for the connection from inside the transaction that holds it would never end.
        refusal = await ctx.saveRecoveryPoint('charged').catch((error: unknown) => error)
        expect(await ctx.saveRecoveryPoint('charged', ctx.tx)).toBe(true)
        await ctx.tx.query('INSERT INTO payments (cart) VALUES ($1)', [key])
        return { status: 201, body: {} }
      }),
    )
    expect(refusal).toMatchObject({ code: '25001' })
    expect((refusal as Error).message).toContain('ctx.saveRecoveryPoint(point, ctx.tx)')
    expect(outcome).toMatchObject({ kind: 'executed' })
    expect(await payments(key)).toBe(1)
    // With no transaction open, the side lane is the connection itself.
    expect((await database.side({ text: 'SELECT 1 AS one', values: [] })).rows).toEqual([{ one: 1 }])
  })

  it('a handler idle past several leases keeps its key; a duplicate waits for it and replays', async () => {
    const engine = createEngine({
      store: postgresStore({ database: pglite({ db }) }),
      reservation,
      leaseMs: 200,
    })
    const key = freshKey()
    const slow = running(async (ctx: { tx: Transaction }) => {
      await ctx.tx.query('INSERT INTO payments (cart) VALUES ($1)', [key])
      await sleep(700)
      return { status: 201, body: {} }
    })
    const first = engine.execute(request<Transaction>(key, slow.handler))
    await slow.started
    const duplicate = await engine.execute(request<Transaction>(key, async () => ({ status: 500 })))
    expect(await first).toMatchObject({ kind: 'executed' })
    expect(duplicate).toMatchObject({ kind: 'replayed', response: { status: 201 } })
    // PGlite reads bytea as a plain Uint8Array: the replay still hands out the Buffer its type promises.
    if (duplicate.kind !== 'replayed') throw new Error('not replayed')
    expect(Buffer.isBuffer(duplicate.response.body)).toBe(true)
    expect(duplicate.response.body.toString('utf8')).toBe('{}')
    expect(await payments(key)).toBe(1)
  })

  it('arms no lease guard on the transaction: PGlite hangs when its idle timer fires', async () => {
    const engine = createEngine({
      store: postgresStore({ database: pglite({ db }) }),
      reservation,
      leaseMs: 200,
    })
    let setting: string | undefined
    await engine.execute(
      request<Transaction>(freshKey(), async (ctx) => {
        const { rows } = await ctx.tx.query<{ timeout: string }>(
          "SELECT current_setting('idle_in_transaction_session_timeout') AS timeout",
        )
        setting = rows[0]?.timeout
        return { status: 201, body: {} }
      }),
    )
    expect(setting).toBe('0')
  })

  it('a process that stalled past its lease still commits once: no one could take its key meanwhile', async () => {
    const key = freshKey()
    let stall = true
    const engine = createEngineForTesting<Transaction>({
      store: postgresStore({ database: pglite({ db }) }),
      reservation,
      leaseMs: 200,
      hooks: {
        beforeCommit: () => {
          if (!stall) return
          stall = false
          stallEventLoop(400)
        },
      },
    })
    const pay = request<Transaction>(key, async (ctx) => {
      await ctx.tx.query('INSERT INTO payments (cart) VALUES ($1)', [key])
      return { status: 201, body: {} }
    })
    const [original, duplicate] = await Promise.all([engine.execute(pay), engine.execute(pay)])
    expect(original).toMatchObject({ kind: 'executed' })
    expect(duplicateKinds).toContain(duplicate.kind)
    expect(await payments(key)).toBe(1)
  })

  it('through the Fetch adapter, its handler called without a server: one payment, the retry replayed', async () => {
    const engine = createEngine({ store: postgresStore({ database: pglite({ db }) }), reservation })
    // `tx` is PGlite's own Transaction, inferred from the engine.
    const handler = idempotency({ engine, tenant: () => 't' })(async (_request, { body, idempotency }) => {
      const { cart } = body as { cart: string }
      await idempotency.tx.query('INSERT INTO payments (cart) VALUES ($1)', [cart])
      return Response.json({ cart })
    })
    const cart = freshKey()
    const post = () =>
      handler(
        new Request('http://localhost/v1/payments', {
          method: 'POST',
          headers: { 'idempotency-key': cart, 'content-type': 'application/json' },
          body: JSON.stringify({ cart }),
        }),
      )
    expect((await post()).status).toBe(200)
    expect((await post()).headers.get('idempotent-replayed')).toBe('true')
    expect(await payments(cart)).toBe(1)
  })
})
