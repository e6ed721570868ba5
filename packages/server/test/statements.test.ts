// The hot statements are prepared once per connection (plan reused), with names that cannot collide between two
// stores on different tables sharing a connection; the reservation's literals survive any quoting.
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { createEngine, migrate, postgresStore } from '../src/index.js'
import { fingerprintOf, freshKey } from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('statements', { max: 1 }) // one connection: both stores share it
  await migrate(db.pool, { schema: 'oncely', table: 'keys_a' })
  await migrate(db.pool, { schema: 'oncely', table: 'keys_b' })
})
afterAll(() => db.drop())

it('prepares reserve and complete once per table on a shared connection, and both tables work', async () => {
  const engines = ['keys_a', 'keys_b'].map((table) =>
    createEngine({ store: postgresStore({ pool: db.pool, table }), replayCache: false }),
  )
  const key = freshKey()
  for (let round = 0; round < 2; round++) {
    for (const [index, engine] of engines.entries()) {
      const outcome = await engine.execute({
        scope: 's',
        operation: 'op',
        key,
        fingerprint: fingerprintOf({ index }),
        handler: async () => ({ status: 201, body: { index } }),
      })
      expect(outcome.kind).toBe(round === 0 ? 'executed' : 'replayed')
      if (outcome.kind === 'executed' || outcome.kind === 'replayed') {
        expect(JSON.parse(outcome.response.body.toString())).toEqual({ index })
      }
    }
  }
  const { rows } = await db.pool.query<{ name: string; statement: string }>(
    `SELECT name, statement FROM pg_prepared_statements WHERE name LIKE 'oncely\\_%' ORDER BY name`,
  )
  const kinds = rows.map((row) => row.name.replace(/_[0-9a-f]{24}/, ''))
  expect(kinds.sort()).toEqual([
    'oncely_complete',
    'oncely_complete',
    'oncely_reserve_sql',
    'oncely_reserve_sql',
  ])
  for (const table of ['keys_a', 'keys_b']) {
    expect(rows.filter((row) => row.statement.includes(`"oncely"."${table}"`))).toHaveLength(2)
  }
})

it('round-trips ids with quotes, backslashes and SQL in them through the reservation literals', async () => {
  const engine = createEngine({
    store: postgresStore({ pool: db.pool, table: 'keys_a' }),
    replayCache: false,
  })
  const nasty = `o'k\\' \\'; DROP TABLE oncely.keys_a; -- \u00e9 $1 E'x'`
  const input = {
    scope: nasty,
    operation: `${nasty} op`,
    key: `${nasty} key`,
    fingerprint: fingerprintOf({ nasty }),
    requestHeaders: { 'x-note': nasty },
    handler: async () => ({ status: 201, body: { nasty } }),
  }
  expect((await engine.execute(input)).kind).toBe('executed')
  expect((await engine.execute(input)).kind).toBe('replayed')
  const { rows } = await db.pool.query(
    'SELECT scope, operation, key, request_headers FROM oncely.keys_a WHERE scope = $1',
    [nasty],
  )
  expect(rows).toEqual([
    { scope: nasty, operation: `${nasty} op`, key: `${nasty} key`, request_headers: { 'x-note': nasty } },
  ])
})
