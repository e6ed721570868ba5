// An inbox delivery that names its tenant: its record is the tenant's (scope = tenant, operation = the consumer and
// topic), so on a key table distributed by tenant (Citus, the 'on citus' projects) it lives on the tenant's node and
// commits there with the handler's writes to the tenant's rows, in one single-node transaction.
import type { TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createInbox, describeInboxEvent, type InboxEvent } from '../../src/inbox/index.js'
import { remoteCommandPool, shardOf } from '../citus/plans.js'
import { engineFor, freshKey, onCitus, paymentsFor, reservation, setupDatabase } from '../helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('inbox_tenant')
})
afterAll(() => db.drop())

const bill = (tenant: string, cart: string) => async (ctx: { tx: import('pg').PoolClient }) => {
  await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 1)', [tenant, cart])
  return { billed: cart }
}

describe(`inbox deliveries keyed by tenant (reservation: '${reservation}')`, () => {
  it('keys the record by tenant, consumer and topic: processed once per consumer, a redelivery is a duplicate', async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
    const billing = createInbox({ engine, consumer: 'billing' })
    const audit = createInbox({ engine, consumer: 'audit' })
    const messageId = freshKey('m')
    const delivery = { messageId, topic: 'orders.created', tenant: 'acme', payload: { order: 1 } }
    expect(await billing.consume({ ...delivery, handler: bill('acme', messageId) })).toEqual({
      kind: 'processed',
      result: { billed: messageId },
    })
    expect(await billing.consume({ ...delivery, handler: bill('acme', messageId) })).toEqual({
      kind: 'duplicate',
      result: { billed: messageId },
    })
    expect((await audit.consume({ ...delivery, handler: async () => 'seen' })).kind).toBe('processed')
    expect(await paymentsFor(db.pool, messageId)).toBe(1)
    const { rows } = await db.pool.query(
      'SELECT scope, operation FROM oncely.idempotency_keys WHERE key = $1 ORDER BY operation',
      [messageId],
    )
    expect(rows).toEqual([
      { scope: 'acme', operation: '["audit","orders.created"]' },
      { scope: 'acme', operation: '["billing","orders.created"]' },
    ])
  })

  it('names the tenant and the record to delete in a mismatch report, and checks the option', async () => {
    const { engine } = engineFor(db.pool)
    const events: InboxEvent[] = []
    const inbox = createInbox({ engine, consumer: 'billing', onEvent: (event) => events.push(event) })
    const messageId = freshKey('m')
    await inbox.consume({ messageId, tenant: 'acme', payload: { amount: 1 }, handler: async () => 1 })
    expect(
      await inbox.consume({ messageId, tenant: 'acme', payload: { amount: 2 }, handler: async () => 2 }),
    ).toEqual({
      kind: 'mismatch',
    })
    expect(events).toEqual([
      { type: 'mismatch', consumer: 'billing', topic: 'message', messageId, tenant: 'acme' },
    ])
    expect(describeInboxEvent(events[0]!)).toContain(
      `tenant "acme") was consumed before with another payload; this delivery was not applied. Check the producer; to apply the new payload, delete the record (scope "acme", operation "[\\"billing\\",\\"message\\"]", key "${messageId}")`,
    )
    await expect(inbox.consume({ messageId, tenant: '', handler: async () => 0 })).rejects.toThrow(
      'Expected `tenant` to be a non-empty string.',
    )
  })

  it.runIf(onCitus)(
    "commits with the handler's writes on the tenant's node; keyed by consumer it spans two nodes",
    async () => {
      const { pool, commands } = remoteCommandPool(db.url)
      try {
        const { engine } = engineFor(pool, { replayCache: false })
        const inbox = createInbox({ engine, consumer: 'billing' })
        // A tenant whose node is not the consumer's, so keying by consumer would put the record elsewhere.
        const consumerNode = (await shardOf(db.pool, 'oncely.idempotency_keys', 'billing')).node
        let tenant = ''
        for (let i = 0; !tenant; i++)
          if ((await shardOf(db.pool, 'payments', `tenant${i}`)).node !== consumerNode) tenant = `tenant${i}`
        const tenantNode = (await shardOf(db.pool, 'payments', tenant)).node
        await inbox.consume({ messageId: freshKey('warm'), tenant, handler: bill(tenant, freshKey()) })

        commands.length = 0
        const keyed = freshKey('m')
        expect((await inbox.consume({ messageId: keyed, tenant, handler: bill(tenant, keyed) })).kind).toBe(
          'processed',
        )
        expect(new Set(commands.map((c) => c.node))).toEqual(new Set([tenantNode]))
        const twoPhase = () => commands.filter((c) => c.command.startsWith('PREPARE TRANSACTION')).length
        // The row protocol's reservation commits in two phases on that node (see test/citus/distribute.test.ts).
        expect(twoPhase()).toBe(reservation === 'row' ? 1 : 0)

        commands.length = 0
        const unkeyed = freshKey('m')
        expect((await inbox.consume({ messageId: unkeyed, handler: bill(tenant, unkeyed) })).kind).toBe(
          'processed',
        )
        expect(new Set(commands.map((c) => c.node))).toEqual(new Set([tenantNode, consumerNode]))
        expect(twoPhase()).toBe((reservation === 'row' ? 1 : 0) + 2)
      } finally {
        await pool.end()
      }
    },
  )
})
