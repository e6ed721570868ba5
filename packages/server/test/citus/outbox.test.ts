// The outbox distributed by tenant on a Citus cluster. The dispatcher's claim over all rows is a FOR UPDATE across
// shards, which Citus refuses; on a distributed outbox the dispatcher claims tenant by tenant (the tenants with due
// rows read first, then each tenant's rows by a statement on its shard, SKIP LOCKED intact), and the purge runs on
// every shard. enqueue's NOTIFY is sent from the coordinator, where a dispatcher listens.
import { type TestDatabase, waitFor } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createDispatcher, enqueue, type OutboxMessage, type Publisher } from '../../src/outbox/index.js'
import { claim, PRESENCE_CLASS } from '../../src/outbox/queries.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'
import { shardOf } from './plans.js'

let db: TestDatabase
/** Tenants whose outbox shards are on each worker. */
let tenants: string[]
beforeAll(async () => {
  db = await setupDatabase('citus_outbox')
  const byNode = new Map<string, string>()
  for (let i = 0; byNode.size < 2; i++) {
    const { node } = await shardOf(db.pool, 'oncely.outbox', `tenant${i}`)
    if (!byNode.has(node)) byNode.set(node, `tenant${i}`)
  }
  tenants = [...byNode.values()]
})
afterAll(() => db.drop())

/** Enqueues through the engine, as a handler does: the outbox row commits with the key record, on the tenant's node. */
async function enqueueFor(scope: string, topic: string, payload: unknown, aggregateKey?: string) {
  const { engine } = engineFor(db.pool, { replayCache: false })
  const outcome = await engine.execute({
    scope,
    operation: 'POST /v1/orders',
    key: freshKey(),
    fingerprint: 'f',
    handler: async (ctx) => {
      await enqueue(ctx.tx, { topic, payload, scope: ctx.scope, ...(aggregateKey ? { aggregateKey } : {}) })
      return { status: 201 }
    },
  })
  expect(outcome.kind).toBe('executed')
}

function recorder(): Publisher & { seen: OutboxMessage[] } {
  const seen: OutboxMessage[] = []
  return {
    seen,
    async publish(message) {
      seen.push(message)
    },
  }
}

const statusOf = async (topic: string) =>
  (
    await db.pool.query<{ scope: string; status: string; n: number }>(
      'SELECT scope, status, count(*)::int AS n FROM oncely.outbox WHERE topic = $1 GROUP BY 1, 2 ORDER BY 1, 2',
      [topic],
    )
  ).rows

describe('the outbox on a Citus cluster', () => {
  it('refuses the single-Postgres claim through the coordinator (a FOR UPDATE across shards)', async () => {
    const { text, values } = claim('oncely.outbox', crypto.randomUUID(), 10, 1_000, null)
    await expect(db.pool.query(text, [...values])).rejects.toMatchObject({
      message: 'could not run distributed query with FOR UPDATE/SHARE commands',
    })
  })

  it("stores each tenant's rows on its node, and a dispatcher publishes every tenant's, each once, marked published", async () => {
    const topic = freshKey('topic')
    for (const tenant of tenants) for (let n = 0; n < 3; n++) await enqueueFor(tenant, topic, { tenant, n })
    const { rows } = await db.pool.query<{ scope: string; node: number }>(
      `SELECT DISTINCT o.scope, s.nodeport AS node FROM oncely.outbox o
       JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column('oncely.outbox', o.scope)
       WHERE o.topic = $1`,
      [topic],
    )
    expect(rows).toHaveLength(2)
    expect(new Set(rows.map((r) => r.node)).size).toBe(2)
    const publisher = recorder()
    const dispatcher = createDispatcher({ pool: db.pool, publisher, listen: false })
    while ((await dispatcher.dispatchOnce()) > 0) {}
    const seen = publisher.seen.filter((m) => m.topic === topic)
    expect(seen).toHaveLength(6)
    expect(new Set(seen.map((m) => m.id)).size).toBe(6)
    expect(await statusOf(topic)).toEqual(
      tenants.sort().map((scope) => ({ scope, status: 'published', n: 3 })),
    )
  })

  it("keeps an aggregate's order within its tenant, one message in flight at a time, with two dispatchers", async () => {
    const topic = freshKey('topic')
    for (const tenant of tenants)
      for (let n = 0; n < 4; n++) await enqueueFor(tenant, topic, { tenant, n }, 'order-1')
    const publisher = recorder()
    const dispatchers = [0, 1].map(() => createDispatcher({ pool: db.pool, publisher, listen: false }))
    let claimed: number[]
    do claimed = await Promise.all(dispatchers.map((d) => d.dispatchOnce()))
    while (claimed.some((n) => n > 0))
    for (const tenant of tenants) {
      const order = publisher.seen
        .filter((m) => m.topic === topic && (m.payload as { tenant: string }).tenant === tenant)
        .map((m) => (m.payload as { n: number }).n)
      expect(order).toEqual([0, 1, 2, 3])
    }
    expect(await statusOf(topic)).toEqual(
      tenants.sort().map((scope) => ({ scope, status: 'published', n: 4 })),
    )
  })

  it('retries a failing publish and dead-letters it after maxAttempts; requeueDead puts it back', async () => {
    const topic = freshKey('topic')
    await enqueueFor(tenants[0]!, topic, { poison: true })
    const failing: Publisher = {
      async publish() {
        throw new Error('broker down')
      },
    }
    const dispatcher = createDispatcher({
      pool: db.pool,
      publisher: failing,
      listen: false,
      maxAttempts: 2,
      retryDelayMs: () => 0,
    })
    await dispatcher.dispatchOnce()
    await dispatcher.dispatchOnce()
    expect(await statusOf(topic)).toEqual([{ scope: tenants[0], status: 'dead', n: 1 }])
    const { rows } = await db.pool.query('SELECT id FROM oncely.outbox WHERE topic = $1', [topic])
    expect(await dispatcher.requeueDead([rows[0].id])).toBe(1)
    expect(await statusOf(topic)).toEqual([{ scope: tenants[0], status: 'pending', n: 1 }])
    const publisher = recorder()
    const healed = createDispatcher({ pool: db.pool, publisher, listen: false })
    await healed.dispatchOnce()
    expect(await statusOf(topic)).toEqual([{ scope: tenants[0], status: 'published', n: 1 }])
  })

  it('is woken by the NOTIFY of a commit through the coordinator (its polling interval is a minute)', async () => {
    const topic = freshKey('topic')
    const publisher = recorder()
    const dispatcher = createDispatcher({ pool: db.pool, publisher, pollIntervalMs: 60_000 })
    dispatcher.start()
    try {
      // Its presence lock is taken once its LISTEN heard its own check notification.
      await waitFor('the dispatcher to listen', async () => {
        const { rows } = await db.pool.query(
          `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::oid AND granted
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
          [PRESENCE_CLASS],
        )
        return rows[0].n > 0
      })
      await enqueueFor(tenants[1]!, topic, { woken: true })
      await waitFor(
        'the message to be published',
        () => publisher.seen.some((m) => m.topic === topic),
        20_000,
      )
    } finally {
      await dispatcher.stop()
    }
  })

  it('purges old published rows on every shard', async () => {
    await db.pool.query(
      `UPDATE oncely.outbox SET published_at = now() - interval '8 days' WHERE status = 'published'`,
    )
    const before = await db.pool.query(
      `SELECT count(*)::int AS n FROM oncely.outbox WHERE status = 'published'`,
    )
    expect(before.rows[0].n).toBeGreaterThan(10)
    const dispatcher = createDispatcher({ pool: db.pool, publisher: recorder(), listen: false })
    expect(await dispatcher.purgePublished({ batchSize: 3 })).toBe(before.rows[0].n)
    const after = await db.pool.query(
      `SELECT count(*)::int AS n FROM oncely.outbox WHERE status = 'published'`,
    )
    expect(after.rows[0].n).toBe(0)
  })
})
