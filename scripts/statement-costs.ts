// What the statements of the lock protocol's first execution cost, variant against variant, in one run:
// `node --import tsx scripts/statement-costs.ts` with DATABASE_URL set (see docs/benchmarks.md, "What the hot path
// does per request"). Each round times both variants of every pair, in an order that alternates, over the same
// number of fresh keys, inside transactions that are rolled back (no commit, no WAL flush). Two kinds of pair:
// `in Postgres` loops the statement in a PL/pgSQL function (the executor's cost alone, plans cached as when
// prepared); `round trips` sends it from node-postgres as the engine does (prepared by name), which adds what the
// answer costs on the wire and in the driver. Prints the median over rounds, in microseconds per statement.
import pg from 'pg'
import { inlineText } from '../packages/server/src/datasources/pg-message.js'
import { renderMigrations } from '../packages/server/src/index.js'
import type { Statement } from '../packages/server/src/store/database.js'
import { tableNames } from '../packages/server/src/store/identifiers.js'
import { lockStatements } from '../packages/server/src/store/lock-queries.js'

const ROUNDS = 9
const PER_ROUND = 2_000
const KEY = 'statement-costs-key'

const url = process.env.DATABASE_URL
if (!url) throw new Error('Set DATABASE_URL to a Postgres server this script may create a database on.')
const admin = new pg.Client({ connectionString: url })
await admin.connect()
const database = `oncely_statement_costs_${process.pid}`
await admin.query(`CREATE DATABASE ${database}`)
const client = new pg.Client({
  connectionString: Object.assign(new URL(url), { pathname: `/${database}` }).href,
})
await client.connect()

/** node-postgres reads a query's `types` as its type parsers: the statement as the datasource sends it. */
const wire = (statement: Statement) => ({
  name: statement.name,
  text: statement.text,
  values: [...statement.values],
})

try {
  // Two key tables: as migration 001 made them (with the CHECK constraints), and as 005 leaves them.
  await client.query('CREATE SCHEMA costs')
  await client.query(renderMigrations({ schema: 'costs', table: 'checked' })[0]!.sql)
  for (const m of renderMigrations({ schema: 'costs', table: 'unchecked' }))
    if (m.appliesTo === 'table') await client.query(m.sql)
  const checked = lockStatements(tableNames('costs', 'checked'), true)
  const unchecked = lockStatements(tableNames('costs', 'unchecked'), true)
  const id = { scope: 'bench', operation: 'POST /ledger', key: KEY }
  const body = Buffer.from(JSON.stringify({ id: 1, amount: 100, currency: 'EUR', note: 'x'.repeat(40) }))
  const record = (token: string | null) => ({
    fingerprint: 'f'.repeat(64),
    status: 'succeeded' as const,
    response: { status: 201, headers: { 'content-type': 'application/json; charset=utf-8' }, body },
    requestHeaders: null,
    retentionMs: 86_400_000,
    seen: null,
    attempt: 1,
    token,
  })

  /** A PL/pgSQL function running `statement` n times, each on the key `prefix || i`; answers us per statement. */
  let functions = 0
  async function inPostgres(statement: Statement): Promise<(prefix: string) => Promise<number>> {
    const name = `costs.run_${functions++}`
    const body = inlineText(statement).replace(`CAST('${KEY}' AS text)`, '(prefix || i)')
    await client.query(`CREATE FUNCTION ${name}(n int, prefix text) RETURNS float8 LANGUAGE plpgsql AS $f$
      DECLARE started timestamptz := clock_timestamp();
      BEGIN
        FOR i IN 1..n LOOP ${body}; END LOOP;
        RETURN extract(epoch FROM clock_timestamp() - started) * 1e6 / n;
      END $f$`)
    return async (prefix) => {
      await client.query('BEGIN')
      const { rows } = await client.query(`SELECT ${name}($1, $2) AS us`, [PER_ROUND, prefix])
      await client.query('ROLLBACK')
      return rows[0].us
    }
  }

  /** Sends `statements(key)` for PER_ROUND fresh keys from this process; answers us per key. */
  const roundTrips = (statements: (key: string) => Statement[]) => async (prefix: string) => {
    await client.query('BEGIN')
    const started = process.hrtime.bigint()
    for (let i = 0; i < PER_ROUND; i++) for (const s of statements(prefix + i)) await client.query(wire(s))
    const us = Number(process.hrtime.bigint() - started) / 1_000 / PER_ROUND
    await client.query('ROLLBACK')
    return us
  }

  // The lock and lookup pair as it was: the lease guard's value as a column of its own, the server in both.
  const lock = unchecked.lock(id, 30_000)
  const oldLock = {
    ...lock,
    name: 'old_lock',
    text: lock.text.replace(
      /\) AND (set_config\(.*?, true\)) IS NOT NULL AS locked/,
      ') AS locked, $1 AS lease_guard',
    ),
  }
  const lookup = unchecked.lockedLookup(id)
  const oldLookup = {
    ...lookup,
    name: 'old_lookup',
    text: lookup.text.replace(
      'updated_at::text AS version',
      `updated_at::text AS version, extract(epoch FROM pg_postmaster_start_time())::float8 AS server`,
    ),
  }
  if (oldLock.text === lock.text || oldLookup.text === lookup.text)
    throw new Error('the old texts did not apply')
  const withKey = (s: Statement, key: string): Statement => ({
    ...s,
    values: [s.values[0], s.values[1], key, ...s.values.slice(3)],
  })

  const pairs: [string, string, (p: string) => Promise<number>, string, (p: string) => Promise<number>][] = [
    [
      'finish of a new key, in Postgres',
      'upsert (ON CONFLICT)',
      await inPostgres(unchecked.finish(id, record('00000000-0000-0000-0000-000000000001'))),
      'plain INSERT',
      await inPostgres(unchecked.finish(id, record(null))),
    ],
    [
      'plain INSERT, in Postgres',
      'with the CHECKs',
      await inPostgres(checked.finish(id, record(null))),
      'without',
      await inPostgres(unchecked.finish(id, record(null))),
    ],
    [
      'lock and lookup of a new key, round trips',
      'columns 3 + 14',
      roundTrips((key) => [withKey(oldLock, key), withKey(oldLookup, key)]),
      'columns 2 + 13',
      roundTrips((key) => [withKey(lock, key), withKey(lookup, key)]),
    ],
    [
      'finish of a new key, round trips',
      'upsert (ON CONFLICT)',
      roundTrips((key) => [
        withKey(unchecked.finish(id, record('00000000-0000-0000-0000-000000000001')), key),
      ]),
      'plain INSERT',
      roundTrips((key) => [withKey(unchecked.finish(id, record(null)), key)]),
    ],
  ]
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
  console.log(
    `${ROUNDS} rounds of ${PER_ROUND} keys per variant; median microseconds per statement (or pair)`,
  )
  for (const [what, nameA, a, nameB, b] of pairs) {
    await a('warm-a')
    await b('warm-b')
    const [timesA, timesB]: number[][] = [[], []]
    for (let round = 0; round < ROUNDS; round++) {
      const order = round % 2 === 0 ? [a, b] : [b, a]
      for (const run of order) (run === a ? timesA : timesB).push(await run(`r${round}-`))
    }
    const [ma, mb] = [median(timesA), median(timesB)]
    console.log(
      `${what}: ${nameA} ${ma.toFixed(1)} us, ${nameB} ${mb.toFixed(1)} us (${(mb - ma).toFixed(1)} us, ${((mb / ma - 1) * 100).toFixed(0)}%)`,
    )
  }
} finally {
  await client.end()
  await admin.query(`DROP DATABASE ${database}`)
  await admin.end()
}
