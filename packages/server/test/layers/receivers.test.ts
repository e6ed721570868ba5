import type { TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createInbox } from '../../src/inbox/index.js'
import { createJobs } from '../../src/jobs/index.js'
import { createWebhookReceiver, signPayload, webhookStatus } from '../../src/webhooks/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('receivers')
  await db.pool.query('CREATE TABLE effects (source text NOT NULL, id text NOT NULL)')
})
afterAll(() => db.drop())

async function effects(source: string, id: string): Promise<number> {
  const { rows } = await db.pool.query(
    'SELECT count(*)::int AS n FROM effects WHERE source = $1 AND id = $2',
    [source, id],
  )
  return rows[0].n
}

describe('inbox', () => {
  it('a consumer that crashes before commit leaves no effect; the redelivery runs once; later ones are no-ops', async () => {
    const { engine } = engineFor(db.pool)
    const inbox = createInbox({ engine, consumer: 'billing' })
    const messageId = freshKey('msg')
    let crash = true
    const handler = async ({ tx }: { tx: import('pg').PoolClient }) => {
      await tx.query("INSERT INTO effects VALUES ('inbox', $1)", [messageId])
      if (crash) throw new Error('killed between effect and commit')
      return { invoice: 7 }
    }
    const deliver = () => inbox.consume({ messageId, topic: 'orders.created', payload: '{"a":1}', handler })
    expect(await deliver()).toMatchObject({ kind: 'failed', retryAfterMs: 1_000 })
    expect(await effects('inbox', messageId)).toBe(0)
    crash = false
    const results = await Promise.all([deliver(), deliver(), deliver()])
    expect(results.filter((r) => r.kind === 'processed')).toEqual([
      { kind: 'processed', result: { invoice: 7 } },
    ])
    expect(await deliver()).toEqual({ kind: 'duplicate', result: { invoice: 7 } })
    expect(await effects('inbox', messageId)).toBe(1)
    expect(
      (await inbox.consume({ messageId, topic: 'orders.created', payload: '{"a":2}', handler })).kind,
    ).toBe('mismatch')
    const other = createInbox({ engine, consumer: 'shipping' })
    expect(
      (await other.consume({ messageId, topic: 'orders.created', payload: '{"a":1}', handler })).kind,
    ).toBe('processed')
  })

  it('stores a permanent failure once and answers it to every redelivery', async () => {
    const { engine } = engineFor(db.pool)
    const inbox = createInbox({ engine, consumer: 'billing', classify: () => 'permanent' })
    let runs = 0
    const handler = async () => {
      runs++
      throw new TypeError('unknown order')
    }
    const messageId = freshKey('msg')
    expect(await inbox.consume({ messageId, handler })).toEqual({
      kind: 'rejected',
      error: { name: 'TypeError', message: 'unknown order' },
    })
    expect((await inbox.consume({ messageId, handler })).kind).toBe('rejected')
    expect(runs).toBe(1)
  })

  it('keeps message ids for 7 days by default', async () => {
    const { engine } = engineFor(db.pool)
    const messageId = freshKey('msg')
    await createInbox({ engine, consumer: 'ttl' }).consume({ messageId, handler: async () => null })
    const { rows } = await db.pool.query(
      "SELECT round(extract(epoch FROM expires_at - created_at) / 86400) AS days FROM oncely.idempotency_keys WHERE scope = 'ttl' AND key = $1",
      [messageId],
    )
    expect(Number(rows[0].days)).toBe(7)
    expect(() => createInbox({ engine, consumer: '' })).toThrow('Expected `consumer`')
  })
})

describe('webhook receiver', () => {
  const secret = 'whsec_receiver'
  const delivery = (event: object, sign = secret) => {
    const rawBody = Buffer.from(JSON.stringify(event))
    return { rawBody, headers: { 'oncely-signature': signPayload(rawBody, { secret: sign }) } }
  }

  it('verifies the signature before any database work, then runs once per provider event id', async () => {
    const { engine, events } = engineFor(db.pool)
    const receiver = createWebhookReceiver({ engine, provider: 'partner', secret })
    const id = freshKey('evt')
    const handler = async (event: unknown, { tx }: { tx: import('pg').PoolClient }) => {
      await tx.query("INSERT INTO effects VALUES ('webhook', $1)", [(event as { id: string }).id])
    }
    const forged = await receiver.receive({ ...delivery({ id }, 'wrong secret'), handler })
    expect(forged).toEqual({ kind: 'invalid_signature' })
    expect(webhookStatus(forged)).toBe(401)
    expect(events).toEqual([])
    // Providers resend the same event with changed fields (attempt counters) and a new signature: still one effect.
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, attempt) => receiver.receive({ ...delivery({ id, attempt }), handler })),
    )
    expect(results.filter((r) => r.kind === 'processed')).toHaveLength(1)
    expect(results.every((r) => ['processed', 'duplicate', 'busy'].includes(r.kind))).toBe(true)
    expect(webhookStatus(await receiver.receive({ ...delivery({ id }), handler }))).toBe(200)
    expect(await effects('webhook', id)).toBe(1)
    expect(await receiver.receive({ ...delivery({ noId: true }), handler })).toMatchObject({
      kind: 'invalid_payload',
    })
  })

  it('refuses a signed body that is not UTF-8, so two event ids differing only in invalid bytes are never one event', async () => {
    const { engine } = engineFor(db.pool)
    const receiver = createWebhookReceiver({ engine, provider: 'partner', secret })
    const id = freshKey('evt')
    const signed = (rawBody: Buffer) => ({
      rawBody,
      headers: { 'oncely-signature': signPayload(rawBody, { secret }) },
    })
    // {"id":"<id>\xff"} and {"id":"<id>\xfe"}: decoded leniently, both read as the id "<id>\ufffd".
    const withByte = (byte: number) =>
      Buffer.concat([Buffer.from(`{"id":"${id}`), Buffer.from([byte]), Buffer.from('"}')])
    let ran = 0
    const handler = async () => {
      ran++
    }
    for (const byte of [0xff, 0xfe]) {
      const result = await receiver.receive({ ...signed(withByte(byte)), handler })
      expect(result).toMatchObject({ kind: 'invalid_payload' })
      expect(webhookStatus(result)).toBe(400)
    }
    expect(ran).toBe(0)
  })
})

describe('scheduled jobs', () => {
  it('runs each occurrence (job id + scheduled time) once across concurrent triggers', async () => {
    const { engine } = engineFor(db.pool)
    const jobs = createJobs({ engine })
    const jobId = freshKey('nightly')
    const run = (scheduledFor: Date) =>
      jobs.runOnce({
        jobId,
        scheduledFor,
        handler: async ({ tx }) => {
          await tx.query("INSERT INTO effects VALUES ('job', $1)", [`${jobId}@${scheduledFor.toISOString()}`])
          return { at: scheduledFor.toISOString() }
        },
      })
    const monday = new Date('2026-01-05T02:00:00Z')
    const results = await Promise.all([run(monday), run(monday), run(monday)])
    expect(results.filter((r) => r.kind === 'processed')).toHaveLength(1)
    expect(await run(monday)).toEqual({ kind: 'duplicate', result: { at: monday.toISOString() } })
    expect((await run(new Date('2026-01-06T02:00:00Z'))).kind).toBe('processed')
    expect(await effects('job', `${jobId}@${monday.toISOString()}`)).toBe(1)
    expect(() => jobs.runOnce({ jobId, scheduledFor: new Date('nope'), handler: async () => 1 })).toThrow(
      'scheduledFor',
    )
  })

  it('a trigger of the same slot one millisecond later is the same occurrence', async () => {
    const { engine } = engineFor(db.pool)
    const jobs = createJobs({ engine })
    const jobId = freshKey('jitter')
    let runs = 0
    const handler = async () => ++runs
    const at = (iso: string) => jobs.runOnce({ jobId, scheduledFor: new Date(iso), handler })
    expect(await at('2026-01-05T02:00:00.000Z')).toEqual({ kind: 'processed', result: 1 })
    expect(await at('2026-01-05T02:00:00.001Z')).toEqual({ kind: 'duplicate', result: 1 })
    expect(await at('2026-01-05T02:00:59.999Z')).toEqual({ kind: 'duplicate', result: 1 })
    expect(await at('2026-01-05T02:01:00.000Z')).toEqual({ kind: 'processed', result: 2 })
    const fine = createJobs({ engine, slotMs: 1_000 })
    expect(
      (await fine.runOnce({ jobId, scheduledFor: new Date('2026-01-05T02:00:01.500Z'), handler })).kind,
    ).toBe('processed')
    expect(() => createJobs({ engine, slotMs: 0 })).toThrow('Expected `slotMs` to be a positive integer')
  })

  it('runs a slot the caller names once, and refuses both a slot and a time', async () => {
    const { engine } = engineFor(db.pool)
    const jobs = createJobs({ engine })
    const jobId = freshKey('named')
    let runs = 0
    const handler = async () => ++runs
    expect(await jobs.runOnce({ jobId, slot: '2026-01-05', handler })).toEqual({
      kind: 'processed',
      result: 1,
    })
    expect(await jobs.runOnce({ jobId, slot: '2026-01-05', handler })).toEqual({
      kind: 'duplicate',
      result: 1,
    })
    expect((await jobs.runOnce({ jobId, slot: '2026-01-06', handler })).kind).toBe('processed')
    const both = { jobId, slot: 'x', scheduledFor: new Date(), handler } as never
    expect(() => jobs.runOnce(both)).toThrow('Expected `slot` or `scheduledFor`, not both.')
    expect(() => jobs.runOnce({ jobId, slot: '', handler })).toThrow(
      'Expected `slot` to be a non-empty string.',
    )
  })
})
