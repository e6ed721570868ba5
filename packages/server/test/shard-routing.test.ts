// Holds the engine to what a tenant-distributed key table needs (Citus and its kin, docs/scaling.md): every statement
// it sends to the key table names one tenant by equality, so each routes to a single shard and the key record can
// commit in the same single-shard transaction as the tenant's business rows. The reaper is the one exception on
// purpose: it sweeps expired rows of every tenant, a maintenance statement a distributed database fans out.
import type { TestDatabase } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { engineFor, fingerprintOf, freshKey, pay, payRequest, reservation, setupDatabase } from './helpers.js'

let db: TestDatabase
const sent: string[] = []
const query = pg.Client.prototype.query
beforeAll(async () => {
  db = await setupDatabase('shard_routing')
  // Records the text of every statement this process sends (protocol-level and SQL-level prepared ones included).
  pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    const [first] = args
    const text = typeof first === 'string' ? first : (first as { text?: string } | undefined)?.text
    if (text) sent.push(text)
    return (query as (...a: unknown[]) => unknown).apply(this, args)
  } as typeof query
})
afterAll(async () => {
  pg.Client.prototype.query = query
  await db.drop()
})

const TABLE = '"oncely"."idempotency_keys"'

/** The statements of one SQL text, split on the semicolons that end them (none of ours has one in a literal). */
const statementsOf = (text: string) =>
  text
    .split(/;\s*(?=BEGIN|COMMIT|EXECUTE|SELECT|PREPARE|WITH|INSERT|UPDATE|DELETE|ROLLBACK|$)/)
    .map((s) => s.trim())
    .filter(Boolean)

describe(`statements on the key table route to one tenant (reservation: '${reservation}')`, () => {
  it('filter on scope by equality, or insert one scope, in every path the engine takes', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false, leaseMs: 5_000 })
    const scope = 'tenant_routing'
    const run = (key: string, extra: Parameters<typeof payRequest>[2] = {}) =>
      engine.execute(payRequest(scope, key, extra))
    const key = freshKey()
    await run(key) // a first execution
    await run(key) // a replay
    await run(key, { fingerprint: fingerprintOf('other') }) // a mismatch
    await engine.peek(payRequest(scope, key))
    await run(freshKey(), { handler: async () => ({ status: 503 }) }) // released after a 5xx
    await run(freshKey(), {
      handler: async () => {
        throw Object.assign(new Error('declined'), { statusCode: 402 })
      },
    }) // a stored permanent failure
    const points = freshKey()
    await run(points, {
      handler: async (ctx) => {
        await ctx.saveRecoveryPoint('charged')
        throw new Error('crash after the charge')
      },
    }) // a recovery point, then a retryable failure
    await run(points, { handler: pay(points) }) // its retry, from the point
    await engine.forget({ scope, operation: 'POST /v1/payments', key })
    await engine.reap()

    // Statements that read or write the key table (the advisory lock's key only names it, in a hash's text).
    const onTable = sent
      .flatMap(statementsOf)
      .filter((s) => [`FROM ${TABLE}`, `INTO ${TABLE}`, `UPDATE ${TABLE}`].some((use) => s.includes(use)))
    expect(onTable.length).toBeGreaterThan(5)
    const unrouted = onTable.filter((statement) => {
      if (/^DELETE FROM \S+ WHERE ctid IN/.test(statement)) return false // the reaper, on purpose
      const inserts =
        /INSERT INTO \S+ AS k \(scope,/.test(statement) && /VALUES \(\$1|SELECT \$1,/.test(statement)
      const filters = statement.includes('scope = $1 AND operation = $2 AND key = $3')
      return !(inserts || filters)
    })
    expect(unrouted).toEqual([])
  })
})
