// Holds the engine to what a tenant-distributed key table needs (Citus and its kin, docs/scaling.md): every statement
// it sends to the key table names one tenant by equality, so each routes to a single shard and the key record can
// commit in the same single-shard transaction as the tenant's business rows. The reaper is the one exception on
// purpose: it sweeps expired rows of every tenant, a maintenance statement a distributed database fans out.
//
// On a real Citus cluster (the 'on citus' projects) the same statements are also EXPLAINed there: each must be a
// router plan, one task on the node holding the tenant's shard, reading that shard only. The row protocol's
// reservation is the one statement Citus cannot plan so (it never router-plans an INSERT inside a CTE); it must
// still run all its steps on that shard's node, so it commits there alone.
import type { TestDatabase } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { planOf, shardOf } from './citus/plans.js'
import {
  engineFor,
  fingerprintOf,
  freshKey,
  gate,
  onCitus,
  pay,
  payRequest,
  reservation,
  running,
  setupDatabase,
} from './helpers.js'

let db: TestDatabase
const sent: { text: string; name?: string; values?: unknown[] }[] = []
const query = pg.Client.prototype.query
let recording = true
beforeAll(async () => {
  db = await setupDatabase('shard_routing')
  // Records every statement this process sends (protocol-level and SQL-level prepared ones included).
  pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    const [first, second] = args
    const text = typeof first === 'string' ? first : (first as { text?: string } | undefined)?.text
    const values = Array.isArray(second) ? second : (first as { values?: unknown[] } | undefined)?.values
    const name = (first as { name?: string } | undefined)?.name
    if (text && recording) sent.push({ text, values, ...(name ? { name } : {}) })
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
    const held = freshKey()
    const release = gate()
    const holder = running(async () => {
      await release.opened
      return { status: 201 }
    })
    const holding = run(held, { handler: holder.handler })
    await holder.started
    await run(held) // a duplicate while the first holds the key (its 409 asks how long it has been held)
    release.open()
    await holding
    await engine.forget({ scope, operation: 'POST /v1/payments', key })
    await engine.reap()

    // Statements that read or write the key table (the advisory lock's key only names it, in a hash's text).
    const onTable = sent
      .flatMap(({ text }) => statementsOf(text))
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

describe.runIf(onCitus)(
  `on a Citus cluster, every hot statement is planned on the tenant's shard (reservation: '${reservation}')`,
  () => {
    it("EXPLAIN shows a router plan on the node holding the shard, for all but the row protocol's reservation", async () => {
      recording = false
      const scope = 'tenant_routing'
      const { shard, node } = await shardOf(db.pool, 'oncely.idempotency_keys', scope)
      // The SQL-level statements, by name, and each statement sent on the key table, once per distinct text.
      const prepared = new Map<string, string>()
      for (const { text } of sent)
        for (const s of statementsOf(text)) {
          const name = /^PREPARE (\S+?)\(/.exec(s)?.[1]
          if (name) prepared.set(name, s)
        }
      const seen = new Set<string>()
      const statements: { kind: string; text: string; values?: unknown[]; prepare?: string }[] = []
      for (const { text, values, name: protocolName } of sent)
        for (const s of statementsOf(text)) {
          const name = /^EXECUTE (\S+?)\(/.exec(s)?.[1]
          const prepare = name ? prepared.get(name) : undefined
          const body = prepare ?? s
          if (!body.includes(TABLE) || /^PREPARE /.test(s) || /^DELETE FROM \S+ WHERE ctid IN/.test(s))
            continue
          // SQL-level statements by their name, protocol-level ones by theirs (or their first words when unnamed).
          const kind =
            (name ?? protocolName)?.replace(/_[0-9a-f]{24}(_sql)?$/, '') ?? s.split(/\s+/, 5).join(' ')
          if (seen.has(kind)) continue
          seen.add(kind)
          statements.push({ kind, text: s, values: name ? undefined : values, prepare })
        }
      expect(statements.length).toBeGreaterThan(4)
      const client = await db.pool.connect()
      const plans: { kind: string; router: boolean; nodes: string[]; relations: string[] }[] = []
      try {
        for (const statement of statements) {
          if (statement.prepare) await client.query(statement.prepare).catch(() => {}) // prepared once
          const shape = await planOf(client, statement.text, statement.values)
          plans.push({
            kind: statement.kind,
            router: shape.distributed && shape.subplans === 0 && shape.tasks.length === 1,
            nodes: [...new Set(shape.tasks.map((t) => t.node))],
            relations: [...new Set(shape.tasks.flatMap((t) => t.relations))],
          })
        }
      } finally {
        client.release(true as unknown as Error) // its prepared statements go with it
      }
      console.info(
        `reservation ${reservation} on Citus: ${plans.map((p) => `${p.kind}: ${p.router ? 'router' : 'not router'}`).join('; ')}`,
      )
      for (const plan of plans) {
        // Every statement reads the key's shard only; a step that reads an intermediate result runs on the coordinator.
        expect(plan.relations, plan.kind).toEqual([shard])
        if (reservation === 'row' && plan.kind === 'oncely_reserve') {
          expect(plan.router, plan.kind).toBe(false) // Citus never router-plans an INSERT inside a CTE
          expect(
            plan.nodes.filter((n) => n !== node && !n.endsWith(`:${new URL(db.url).port}`)),
            plan.kind,
          ).toEqual([])
        } else {
          expect(plan.router, plan.kind).toBe(true)
          expect(plan.nodes, plan.kind).toEqual([node])
        }
      }
    })
  },
)
