// The hot statements are prepared once per connection (plan reused), with names that cannot collide between two
// stores on different tables sharing a connection; the reservation's literals survive any quoting.
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, expect, it, onTestFinished } from 'vitest'
import { createEngine, migrate, nodePostgres, postgresStore } from '../src/index.js'
import { bind, statementTexts } from '../src/store/queries.js'
import { createEngineForTesting } from '../src/testing/index.js'
import { fingerprintOf, freshKey, gate, reservation, sleep, stallEventLoop } from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('statements', { max: 1 }) // one connection: both stores share it
  await migrate(db.pool, { schema: 'oncely', table: 'keys_a' })
  await migrate(db.pool, { schema: 'oncely', table: 'keys_b' })
})
afterAll(() => db.drop())

it('prepares its statements once per table on a shared connection, and both tables work', async () => {
  const engines = ['keys_a', 'keys_b'].map((table) =>
    createEngine({ store: postgresStore({ pool: db.pool, table }), replayCache: false, reservation }),
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
  // The row protocol's reservation and completion; the lock protocol's lookup and the finish of a new key's success (a plain
  // INSERT): once per table, each named after the property that builds it. The lock protocol's lock names no table
  // (the table is in its parameter, the text it hashes), so both stores share it.
  const prepared = reservation === 'row' ? ['complete', 'reserve'] : ['insert_succeeded', 'locked_lookup']
  const shared = reservation === 'row' ? [] : ['oncely_lock_sql']
  expect(kinds.sort()).toEqual(
    [...shared, ...prepared.flatMap((kind) => [`oncely_${kind}_sql`, `oncely_${kind}_sql`])].sort(),
  )
  for (const table of ['keys_a', 'keys_b']) {
    expect(rows.filter((row) => row.statement.includes(`"oncely"."${table}"`))).toHaveLength(prepared.length)
  }
})

it('round-trips ids and headers with quotes, backslashes and SQL in them, and every byte of a body, through the literals', async () => {
  const engine = createEngine({
    store: postgresStore({ pool: db.pool, table: 'keys_a' }),
    replayCache: false,
    reservation,
  })
  // Every byte value; the large one goes through a binary parameter instead of a literal (INLINE_BODY_BYTES).
  for (const size of [512, 40_000]) {
    const bytes = Buffer.from(Array.from({ length: size }, (_, index) => index % 256))
    const nasty = `o'k\\' \\'; DROP TABLE oncely.keys_a; -- \u00e9 $1 E'x' ${reservation} ${size}`
    const input = {
      scope: nasty,
      operation: `${nasty} op`,
      key: `${nasty} key`,
      fingerprint: fingerprintOf({ nasty }),
      requestHeaders: { 'x-note': nasty },
      handler: async () => ({ status: 201, headers: { etag: nasty }, body: bytes }),
    }
    expect((await engine.execute(input)).kind).toBe('executed')
    const replay = await engine.execute(input)
    expect(replay).toMatchObject({ kind: 'replayed', response: { status: 201, headers: { etag: nasty } } })
    if (replay.kind === 'replayed') expect(replay.response.body.equals(bytes)).toBe(true)
    const { rows } = await db.pool.query(
      'SELECT scope, operation, key, request_headers FROM oncely.keys_a WHERE scope = $1',
      [nasty],
    )
    expect(rows).toEqual([
      { scope: nasty, operation: `${nasty} op`, key: `${nasty} key`, request_headers: { 'x-note': nasty } },
    ])
  }
})

for (const preparedStatements of [true, false]) {
  it(`fences out an attempt that lost its key, preparedStatements: ${preparedStatements}`, async () => {
    const pool = new pg.Pool({ connectionString: db.url, max: 4 }) // the paused attempt holds one connection
    onTestFinished(() => pool.end())
    const store = postgresStore({ pool, table: 'keys_b', preparedStatements })
    let paused = true
    const stalled = gate()
    // The paused attempt commits only once the other one has: a fixed wait could end first on a loaded machine,
    // and the paused attempt would find the key free rather than finished.
    const wonBy = gate()
    const slow = createEngineForTesting({
      store,
      reservation,
      leaseMs: 100,
      replayCache: false,
      // The process stalls past the lease (so it stops renewing), then waits: its transaction sits idle meanwhile.
      hooks: {
        beforeCommit: () => {
          if (!paused) return undefined
          stalled.open()
          stallEventLoop(200)
          return wonBy.opened
        },
      },
    })
    const fast = createEngine({ store, reservation, leaseMs: 5_000, replayCache: false })
    const key = freshKey()
    const input = (who: string) => ({
      scope: 's',
      operation: 'fence',
      key,
      fingerprint: fingerprintOf({ key }),
      handler: async () => ({ status: 201, body: { who } }),
    })
    const first = slow.execute(input('slow'))
    await stalled.opened // resumes past the stall in its commit hook, which stops this whole process
    paused = false
    // The paused attempt's transaction sat idle past the lease and was ended: under 'lock' it left no record.
    const winner = await fast.execute({ ...input('fast'), wait: { timeoutMs: 5_000 } })
    wonBy.open()
    expect(winner).toMatchObject({ kind: 'executed', attempt: reservation === 'row' ? 2 : 1 })
    const lost = await first
    expect(lost).toMatchObject({ kind: 'replayed', fencedOut: true })
    if (lost.kind === 'replayed') expect(JSON.parse(lost.response.body.toString())).toEqual({ who: 'fast' })
  })
}

it('sends no prepared statement with preparedStatements: false (transaction-mode poolers)', async () => {
  const other = await createTestDatabase('statements_plain', { max: 1 })
  try {
    await migrate(other.pool)
    const engine = createEngine({
      store: postgresStore({ pool: other.pool, preparedStatements: false }),
      replayCache: false,
      reservation,
    })
    const input = (body: unknown) => ({
      scope: 's',
      operation: 'op',
      key: 'k',
      fingerprint: fingerprintOf(body),
      handler: async () => ({ status: 201, body: { ok: true } }),
    })
    expect((await engine.execute(input(1))).kind).toBe('executed')
    expect((await engine.execute(input(1))).kind).toBe('replayed')
    expect((await engine.execute(input(2))).kind).toBe('mismatch')
    const { rows } = await other.pool.query('SELECT name FROM pg_prepared_statements')
    expect(rows).toEqual([])
    expect(() => postgresStore({ pool: other.pool, preparedStatements: 'yes' as never })).toThrow(
      /`preparedStatements`/,
    )
  } finally {
    await other.drop()
  }
})

it("reads a key's row, and fences on it, whatever the session's DateStyle, TimeZone, IntervalStyle and bytea_output", async () => {
  // The lock protocol reads the row as JSON and derives its times here; the row protocol derives them in SQL. Both
  // must read a session set up unlike the defaults as they read one that is not.
  const pool = new pg.Pool({
    connectionString: db.url,
    max: 2,
    options:
      '-c DateStyle=SQL,DMY -c TimeZone=Pacific/Chatham -c IntervalStyle=sql_standard -c bytea_output=escape',
  })
  onTestFinished(() => pool.end())
  const engine = createEngine({
    store: postgresStore({ pool, table: 'keys_a' }),
    replayCache: false,
    reservation,
    leaseMs: 1_000,
  })
  const body = Buffer.from(Array.from({ length: 300 }, (_, index) => index % 256))
  const key = freshKey()
  const input = (who: string, retentionMs = 1_500) => ({
    scope: 's',
    operation: 'settings',
    key,
    retentionMs,
    fingerprint: fingerprintOf({ key }),
    handler: async () => ({ status: 201, headers: { etag: who }, body }),
  })
  expect(await engine.execute(input('first'))).toMatchObject({ kind: 'executed', attempt: 1 })
  const replay = await engine.execute(input('second'))
  expect(replay).toMatchObject({ kind: 'replayed', response: { status: 201, headers: { etag: 'first' } } })
  if (replay.kind === 'replayed') expect(replay.response.body.equals(body)).toBe(true)
  // The replay's expiry was read from the row: it expires within the retention, not before, not after.
  const { rows } = await db.pool.query(
    `SELECT (extract(epoch FROM expires_at - now()) * 1000)::float8 AS left_ms FROM oncely.keys_a WHERE key = $1`,
    [key],
  )
  expect(rows[0].left_ms).toBeGreaterThan(0)
  expect(rows[0].left_ms).toBeLessThanOrEqual(1_500)
  expect((await engine.execute({ ...input('other'), fingerprint: fingerprintOf({ other: key }) })).kind).toBe(
    'mismatch',
  )
  // Once expired, the key is new again: the attempt replaces the row it saw, fenced on its version as it read it.
  await sleep(1_600)
  expect(await engine.execute(input('third', 60_000))).toMatchObject({ kind: 'executed' })
  const again = await engine.execute(input('fourth'))
  expect(again).toMatchObject({ kind: 'replayed', response: { headers: { etag: 'third' } } })
})

it('sends a prepared statement without parameters in one message with others', async () => {
  // Postgres refuses an empty parameter list (`PREPARE name() AS`, `EXECUTE name()`): none is written.
  const { noParameters } = statementTexts({ noParameters: { types: [], text: 'SELECT 1 AS one' } })
  const session = await nodePostgres({ pool: db.pool }).session()
  try {
    for (let round = 0; round < 2; round++) {
      const results = await session.run(['BEGIN', bind(noParameters, []), 'COMMIT'])
      expect(results[1]!.rows).toEqual([{ one: 1 }])
    }
  } finally {
    session.release()
  }
})
