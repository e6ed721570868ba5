// Round trips per request, counted on the wire: a TCP proxy between the library and Postgres counts a turn each time
// the client sends after the server spoke. postgres.js pipelines the queries of a transaction, and the callback
// session sends the steps of one run together for it, so a first execution through postgres.js costs one round trip
// more than through node-postgres (which sends the steps in one message): its BEGIN travels alone, as `sql.begin`
// calls back only after it.
import {
  type CountingProxy,
  countingProxy,
  createTestDatabase,
  type TestDatabase,
} from '@oncely/test-support'
import pg from 'pg'
import postgres from 'postgres'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { createEngine, type Database, migrate, nodePostgres, postgresStore } from '../../src/index.js'
import { postgresJs } from '../../src/postgres-js/index.js'
import { fingerprintOf } from '../helpers.js'

let db: TestDatabase
let proxy: CountingProxy
let url: string
beforeAll(async () => {
  db = await createTestDatabase('round_trips')
  await migrate(db.pool)
  await db.pool.query('CREATE TABLE payments (id bigserial PRIMARY KEY, cart text NOT NULL)')
  proxy = await countingProxy(db.url)
  url = proxy.url
})
afterAll(async () => {
  await proxy?.close()
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
    const before = proxy.counts().roundTrips
    for (let i = 0; i < times; i++) await work(i)
    return Math.round((proxy.counts().roundTrips - before) / times)
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
