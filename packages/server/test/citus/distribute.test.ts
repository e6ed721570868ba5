// distribute() on a real Citus cluster: the layout it makes (the key table and the outbox distributed by scope, in
// the business tables' co-location group; the migration ledger a plain table on the coordinator), what it refuses,
// and what the layout is for: a request's key record, business rows and outbox row commit on the tenant's node alone,
// never with two-phase commit. Per protocol.
import { createCitusTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest'
import { distribute, migrate } from '../../src/index.js'
import { enqueue } from '../../src/outbox/index.js'
import { engineFor, freshKey, payRequest, reservation, setupDatabase } from '../helpers.js'
import { remoteCommandPool, shardOf } from './plans.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('citus_distribute')
})
afterAll(() => db.drop())

describe(`distribute() (reservation: '${reservation}')`, () => {
  it('distributes the key table and the outbox by scope, co-located with the business table; the ledger stays local', async () => {
    const { rows } = await db.pool.query(
      `SELECT table_name::text AS table, citus_table_type AS type, distribution_column AS column, colocation_id
       FROM citus_tables ORDER BY 1`,
    )
    expect(rows.map(({ table, type, column }) => ({ table, type, column }))).toEqual([
      { table: 'oncely.idempotency_keys', type: 'distributed', column: 'scope' },
      { table: 'oncely.outbox', type: 'distributed', column: 'scope' },
      { table: 'orders', type: 'distributed', column: 'tenant' },
      { table: 'payments', type: 'distributed', column: 'tenant' },
    ])
    expect(new Set(rows.map((r) => r.colocation_id)).size).toBe(1)
    const ledger = await db.pool.query(
      `SELECT count(*)::int AS n FROM pg_dist_partition WHERE logicalrelid = 'oncely.oncely_migrations'::regclass`,
    )
    expect(ledger.rows[0].n).toBe(0)
    // Called again (every instance does at start-up), it changes nothing.
    expect((await distribute(db.pool, { colocateWith: 'payments' })).distributed).toEqual([])
    // Later migrations run through the coordinator, which propagates DDL to the shards.
    expect((await migrate(db.pool)).applied).toEqual([])
  })

  it("commits a request's key record, payment and outbox row on the tenant's node alone, in one transaction", async () => {
    const { pool, commands } = remoteCommandPool(db.url)
    try {
      const { engine } = engineFor(pool, { replayCache: false })
      const scope = 'tenant_one_node'
      const { node } = await shardOf(db.pool, 'oncely.idempotency_keys', scope)
      const key = freshKey()
      const request = payRequest(scope, key, {
        handler: async (ctx) => {
          await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100)', [
            ctx.scope,
            key,
          ])
          await enqueue(ctx.tx, { topic: 'payments.created', payload: { key }, scope: ctx.scope })
          return { status: 201, body: { key } }
        },
      })
      await engine.execute(request) // connections warmed up, statements prepared
      commands.length = 0
      expect(await engine.execute({ ...request, key: freshKey() })).toMatchObject({ kind: 'executed' })
      const nodes = new Set(commands.map((c) => c.node))
      expect([...nodes]).toEqual([node])
      const twoPhase = commands.filter((c) => c.command.startsWith('PREPARE TRANSACTION')).length
      const commits = commands.filter((c) => c.command === 'COMMIT').length
      // The business transaction commits in one phase. Under the row protocol the reservation, committed before it
      // on its own, is an INSERT ... SELECT that Citus plans through the coordinator and so commits in two phases,
      // on the one worker all the same.
      expect({ twoPhase, commits }).toEqual(
        reservation === 'row' ? { twoPhase: 1, commits: 1 } : { twoPhase: 0, commits: 1 },
      )
      console.info(
        `reservation ${reservation} on Citus: a first execution sends ${commands.length} commands, all to the tenant's worker: ${commits} one-phase commit, ${twoPhase} two-phase`,
      )

      // The check can fail: a handler writing another tenant's row makes it a two-node, two-phase commit.
      const other = ['t1', 't2', 't3', 't4', 't5', 't6', 't7', 't8']
      let elsewhere: string | undefined
      for (const tenant of other)
        if ((await shardOf(db.pool, 'payments', tenant)).node !== node) elsewhere ??= tenant
      commands.length = 0
      await engine.execute(
        payRequest(scope, freshKey(), {
          handler: async (ctx) => {
            await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 1)', [
              elsewhere,
              'x',
            ])
            return { status: 201 }
          },
        }),
      )
      expect(commands.filter((c) => c.command.startsWith('PREPARE TRANSACTION')).length).toBe(twoPhase + 2)
    } finally {
      await pool.end()
    }
  })

  it('refuses what it cannot make safe, naming the fix', async () => {
    await expect(distribute(db.pool, { colocateWith: 'payments', shardCount: 4 })).rejects.toThrow(
      'Expected `shardCount` or `colocateWith`, not both',
    )
    await expect(distribute(db.pool, { shardCount: 0 })).rejects.toThrow(
      'Expected `shardCount` to be a positive integer, got 0.',
    )
    await db.pool.query('CREATE TABLE IF NOT EXISTS plain (tenant text PRIMARY KEY)')
    await expect(distribute(db.pool, { colocateWith: 'plain' })).rejects.toThrow(
      "Expected `colocateWith` (plain) to be a table distributed by the tenant: run SELECT create_distributed_table('plain', '<tenant column>') first.",
    )
    await db.pool.query(
      `CREATE TABLE IF NOT EXISTS by_other (tenant text, n int, PRIMARY KEY (tenant, n));
       SELECT create_distributed_table('by_other', 'tenant', shard_count => 2)
       WHERE NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'by_other'::regclass)`,
    )
    await expect(distribute(db.pool, { colocateWith: 'by_other' })).rejects.toThrow(
      'is distributed by scope, but not co-located with by_other',
    )
  })

  it('needs Citus and a migrated database, and moves rows written before onto the shards', async () => {
    const fresh = await createCitusTestDatabase('citus_distribute_fresh', { cluster: inject('citusUrl') })
    try {
      await expect(distribute(fresh.pool)).rejects.toThrow('run `await migrate(pool)` first.')
      await migrate(fresh.pool)
      await fresh.pool.query(
        `INSERT INTO oncely.idempotency_keys (scope, operation, key, fingerprint, status, expires_at)
         SELECT 't' || g, 'o', 'k', 'f', 'succeeded', now() + interval '1 hour' FROM generate_series(1, 20) g`,
      )
      const result = await distribute(fresh.pool, { shardCount: 2 })
      expect(result.distributed).toEqual(['"oncely"."idempotency_keys"', '"oncely".outbox'])
      const { rows } = await fresh.pool.query('SELECT count(*)::int AS n FROM oncely.idempotency_keys')
      expect(rows[0].n).toBe(20)
      // The coordinator's own copy was emptied: the rows live on the shards only.
      const local = await fresh.pool.query(`SELECT pg_relation_size('oncely.idempotency_keys')::int AS bytes`)
      expect(local.rows[0].bytes).toBe(0)
    } finally {
      await fresh.drop()
    }
  })
})
