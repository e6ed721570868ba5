// Round trips per request, counted on the wire: a TCP proxy between the library and Postgres counts a turn each time
// the client sends after the server spoke. postgres.js pipelines the queries of a transaction, and the callback
// session sends the steps of one run together for it, so a first execution through postgres.js costs one round trip
// more than through node-postgres (which sends the steps in one message): its BEGIN travels alone, as `sql.begin`
// calls back only after it.
import net from 'node:net'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import pg from 'pg'
import postgres from 'postgres'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { createEngine, type Database, migrate, nodePostgres, postgresStore } from '../../src/index.js'
import { postgresJs } from '../../src/postgres-js/index.js'
import { fingerprintOf } from '../helpers.js'

let db: TestDatabase
let proxy: net.Server
let url: string
let turns = 0
beforeAll(async () => {
  db = await createTestDatabase('round_trips')
  await migrate(db.pool)
  await db.pool.query('CREATE TABLE payments (id bigserial PRIMARY KEY, cart text NOT NULL)')
  const target = new URL(db.url)
  let serverSpoke = true
  proxy = net.createServer((client) => {
    const server = net.connect(Number(target.port || 5432), target.hostname)
    client.on('data', (chunk) => {
      if (serverSpoke) turns++
      serverSpoke = false
      server.write(chunk)
    })
    server.on('data', (chunk) => {
      serverSpoke = true
      client.write(chunk)
    })
    for (const [a, b] of [
      [client, server],
      [server, client],
    ] as const) {
      a.on('error', () => {})
      a.on('close', () => b.destroy())
    }
  })
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve))
  const through = new URL(db.url)
  through.host = `127.0.0.1:${(proxy.address() as net.AddressInfo).port}`
  url = through.href
})
afterAll(async () => {
  await new Promise((resolve) => proxy?.close(resolve))
  await db?.drop()
})

/** Round trips of a first execution and of a replay, on one connection after it has been used. */
async function roundTrips<Tx>(
  database: Database<Tx>,
  insert: (tx: Tx, cart: string) => Promise<unknown>,
  reservation: 'lock' | 'row',
) {
  const engine = createEngine<Tx>({ store: postgresStore({ database }), reservation, replayCache: false })
  const run = (key: string) =>
    engine.execute({
      scope: 't',
      operation: 'POST /v1/payments',
      key,
      fingerprint: fingerprintOf({ key }),
      handler: async (ctx) => {
        await insert(ctx.tx, key)
        return { status: 201, body: {} }
      },
    })
  const prefix = `${database.library}-${reservation}`
  // The connection opened and the statements prepared on it.
  for (let i = 0; i < 3; i++) await run(`${prefix}-warm-${i}`)
  await run(`${prefix}-warm-0`)
  // Per request, over several: a rollback sent without waiting for its answer shows in the next request's count.
  const times = 10
  const counted = async (work: (i: number) => Promise<unknown>) => {
    const before = turns
    for (let i = 0; i < times; i++) await work(i)
    return Math.round((turns - before) / times)
  }
  return {
    first: await counted((i) => run(`${prefix}-new-${i}`)),
    replay: await counted((i) => run(`${prefix}-new-${i}`)),
  }
}

it.each(['lock', 'row'] as const)(
  "postgres.js sends a request's steps together: round trips under '%s'",
  async (reservation) => {
    const pool = new pg.Pool({ connectionString: url, max: 1 })
    const sql = postgres(url, { max: 1, onnotice: () => {} })
    try {
      const viaPg = await roundTrips(
        nodePostgres({ pool }),
        (tx, cart) => tx.query('INSERT INTO payments (cart) VALUES ($1)', [cart]),
        reservation,
      )
      const viaPostgresJs = await roundTrips(
        postgresJs({ sql }),
        (tx, cart) => tx`INSERT INTO payments (cart) VALUES (${cart})`,
        reservation,
      )
      console.info(
        `round trips under '${reservation}': node-postgres ${JSON.stringify(viaPg)}, postgres.js ${JSON.stringify(viaPostgresJs)}`,
      )
      // The reservation and its lookup, the handler's insert, the finished record and the COMMIT.
      expect(viaPg).toEqual({ first: 3, replay: 2 })
      if (reservation === 'lock') expect(viaPostgresJs).toEqual({ first: 4, replay: 3 })
      // The row protocol commits its reservation in a transaction of its own, then begins the business one: two
      // transactions of the library, each with a BEGIN that travels alone.
      else expect(viaPostgresJs).toEqual({ first: 7, replay: 6 })
    } finally {
      await Promise.all([pool.end(), sql.end()])
    }
  },
)
