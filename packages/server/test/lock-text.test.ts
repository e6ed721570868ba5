// The lock protocol locks a key under the 64-bit hash of a text the engine builds (lockText): every version of oncely
// must build the same text, or two versions running side by side during a deploy would lock one key under two locks
// and both run it. Earlier versions built it in SQL; this holds the engine's text to that expression, for every kind
// of character a tenant, an operation or a key can hold.
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { tableNames } from '../src/store/identifiers.js'
import { byteaOf, lockText, timestampMs } from '../src/store/lock-queries.js'

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('lock_text', { max: 1 })
})
afterAll(() => db.drop())

/** The text as versions before the lock text was built in the engine hashed it, in SQL. */
const SQL_TEXT = (qualified: string) =>
  `'${qualified.replaceAll("'", "''")}|' || length($1) || ':' || $1 || '|' || length($2) || ':' || $2 || '|' || $3`

it('builds the text earlier versions hashed in SQL, for ASCII, quotes, accents, CJK, emoji and combining marks', async () => {
  const samples = [
    'bench',
    '',
    'POST /v1/payments/:id',
    'o\'k \\ "quoted" |:| 12:',
    'é',
    'e\u0301', // e and a combining acute: two characters
    '支払い',
    '💳 pay 🧾', // astral characters: one character each, two UTF-16 units
    '𝔘𝔫𝔦𝔠𝔬𝔡𝔢'.repeat(20),
    'x'.repeat(300),
  ]
  const cases: [string, string, string][] = []
  for (const a of samples)
    for (const b of samples.slice(0, 5)) cases.push([a, b, samples[(a.length + b.length) % samples.length]!])
  for (const [schema, table] of [
    ['oncely', 'idempotency_keys'],
    ['My "Schema"', "it's"],
  ] as const) {
    const names = tableNames(schema, table)
    for (const [scope, operation, key] of cases) {
      const { rows } = await db.pool.query(
        `SELECT $4 = (${SQL_TEXT(names.qualified)}) AS same, hashtextextended($4, 0) = hashtextextended(${SQL_TEXT(names.qualified)}, 0) AS same_lock`,
        [scope, operation, key, lockText(names, { scope, operation, key })],
      )
      expect(rows[0], JSON.stringify([schema, table, scope, operation, key])).toEqual({
        same: true,
        same_lock: true,
      })
    }
  }
})

it('reads timestamps as Postgres writes them in JSON, to the microsecond, in any time zone', async () => {
  for (const zone of ['UTC', 'Asia/Kolkata', 'America/St_Johns', 'Africa/Abidjan', 'Pacific/Chatham']) {
    const { rows } = await db.pool
      .query(
        `SET TIME ZONE '${zone}'; SELECT to_json(t)::text AS json, (extract(epoch FROM t) * 1000)::float8 AS ms
       FROM (VALUES (timestamptz '2026-12-07 04:50:48.099123+00'), ('2026-12-07 04:50:48+00'),
         ('2026-06-30 23:59:59.5+00'), ('1883-11-18 12:00:00.000001+00')) AS v(t)`,
      )
      .then((results) => (results as unknown as { rows: { json: string; ms: number }[] }[])[1]!)
    for (const { json, ms } of rows)
      expect(timestampMs(JSON.parse(json) as string), `${zone} ${json}`).toBeCloseTo(ms, 3)
  }
  await db.pool.query('RESET TIME ZONE')
  expect(() => timestampMs('infinity')).toThrow(/unexpected timestamp/)
})

it('reads a bytea as Postgres writes it in text, in either output format', async () => {
  const bytes = Buffer.from(Array.from({ length: 512 }, (_, index) => index % 256))
  for (const format of ['hex', 'escape']) {
    await db.pool.query(`SET bytea_output = ${format}`)
    const { rows } = await db.pool.query('SELECT to_json($1::bytea)::text AS json', [bytes])
    expect(byteaOf(JSON.parse(rows[0]!.json) as string).equals(bytes), format).toBe(true)
  }
  await db.pool.query('RESET bytea_output')
})
