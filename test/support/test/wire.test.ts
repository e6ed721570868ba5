// The counting proxy, against a real Postgres: what it counts for statements whose round trips and statements are
// known, and the statement splitter of simple queries.
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createTestDatabase, type TestDatabase } from '../src/index.js'
import { type CountingProxy, countingProxy, countStatements } from '../src/wire.js'

describe('countStatements', () => {
  it('counts the statements of a simple query, not the semicolons inside quotes or comments', () => {
    expect(countStatements('BEGIN; SELECT 1')).toBe(2)
    expect(countStatements("SELECT ';'; -- a; comment\nCOMMIT;")).toBe(2)
    expect(countStatements('SELECT $$a;b$$; /* ; */ SELECT "x;y" FROM t')).toBe(2)
    expect(countStatements(' ; ')).toBe(0)
  })
})

describe('countingProxy', () => {
  let db: TestDatabase
  let proxy: CountingProxy
  let client: pg.Client
  beforeAll(async () => {
    db = await createTestDatabase('support_wire')
    proxy = await countingProxy(db.url)
    client = new pg.Client({ connectionString: proxy.url })
    await client.connect()
  })
  afterAll(async () => {
    await client?.end()
    await proxy?.close()
    await db?.drop()
  })

  it('counts one round trip for statements sent together and one per statement', async () => {
    const before = proxy.counts()
    await client.query('BEGIN; SELECT 1; COMMIT')
    const simple = proxy.counts()
    expect(simple.roundTrips - before.roundTrips).toBe(1)
    expect(simple.statements - before.statements).toBe(3)
    // Parse, Bind, Describe, Execute, Sync in one write: one round trip, one statement.
    await client.query('SELECT $1::int AS n', [1])
    const extended = proxy.counts()
    expect(extended.roundTrips - simple.roundTrips).toBe(1)
    expect(extended.statements - simple.statements).toBe(1)
    expect(extended.bytesToPostgres).toBeGreaterThan(simple.bytesToPostgres)
    expect(extended.bytesFromPostgres).toBeGreaterThan(simple.bytesFromPostgres)
    expect(extended.connections).toBe(1)
  })
})
