import {
  AckPolicy,
  type Consumer,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
} from '@nats-io/jetstream'
import { connect, type NatsConnection, nanos } from '@nats-io/transport-node'
import type { TestDatabase } from '@oncely/test-support'
import { optionalService, pullNext, spawnTsx } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createInbox, type InboxEvent } from '../../src/inbox/index.js'
import {
  consumeJetStreamMessage,
  type JetStreamConsumeOptions,
  jetStreamPublisher,
  NoStreamForSubjectError,
} from '../../src/nats/index.js'
import { createDispatcher, enqueue } from '../../src/outbox/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

const nats = await optionalService('NATS_URL', 'nats://127.0.0.1:4222')
if (nats.skip) console.warn(`skipping JetStream tests: ${nats.skip}`)

describe.skipIf(nats.skip)('outbox → JetStream → inbox', () => {
  let db: TestDatabase
  let nc: NatsConnection
  let jsm: JetStreamManager
  const stream = `ONCELY_${freshKey('s').replace(/[^A-Za-z0-9]/g, '_')}`
  const subject = `oncely.test.${stream}`

  beforeAll(async () => {
    db = await setupDatabase('jetstream')
    await db.pool.query('CREATE TABLE effects (message_id text NOT NULL, amount integer NOT NULL)')
    nc = await connect({ servers: nats.url })
    jsm = await jetstreamManager(nc)
    await jsm.streams.add({ name: stream, subjects: [`${subject}.>`], duplicate_window: nanos(120_000) })
  })
  const extraStreams: string[] = []
  afterAll(async () => {
    for (const name of [stream, ...extraStreams]) await jsm?.streams.delete(name).catch(() => {})
    await nc?.close()
    await db?.drop()
  })

  async function enqueueOrders(topic: string, count: number): Promise<string[]> {
    const { engine } = engineFor(db.pool)
    const ids: string[] = []
    for (let n = 0; n < count; n++) {
      await engine.execute({
        scope: 'tenant',
        operation: 'POST /orders',
        key: freshKey(),
        fingerprint: 'f',
        handler: async ({ tx }) => {
          ids.push(await enqueue(tx, { topic, payload: { amount: 100 + n }, aggregateKey: 'order-stream' }))
          return { status: 201 }
        },
      })
    }
    return ids
  }

  /**
   * Consumes `filter` through the inbox until `expected` deliveries were acked; `crashAfterCommit` commits but skips
   * the ack of those ids once.
   */
  async function drain(
    filter: string,
    durable: string,
    expected: number,
    crashAfterCommit = new Set<string>(),
    streamName = stream,
  ) {
    const { engine } = engineFor(db.pool)
    const inbox = createInbox({ engine, consumer: 'billing' })
    await jsm.consumers.add(streamName, {
      durable_name: durable,
      filter_subject: filter,
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(1_000),
    })
    const consumer = await jetstream(nc).consumers.get(streamName, durable)
    const kinds: string[] = []
    const deadline = Date.now() + 20_000
    const acked = () => kinds.filter((k) => k === 'processed' || k === 'duplicate').length
    while (acked() < expected && Date.now() < deadline) {
      const msg = await pullNext(consumer, 1_000)
      if (!msg) continue
      const id = msg.headers?.get('Nats-Msg-Id') ?? ''
      if (crashAfterCommit.delete(id)) {
        // The consumer commits the effect, then dies before the ack: JetStream redelivers after ack_wait.
        const result = await inbox.consume({
          messageId: id,
          topic: msg.subject,
          payload: msg.data,
          handler: async ({ tx }) => {
            await tx.query('INSERT INTO effects VALUES ($1, $2)', [
              id,
              (msg.json() as { amount: number }).amount,
            ])
          },
        })
        kinds.push(`${result.kind} (no ack)`)
        continue
      }
      const result = await consumeJetStreamMessage(inbox, msg, async ({ tx, messageId }, data) => {
        await tx.query('INSERT INTO effects VALUES ($1, $2)', [
          messageId,
          (data as { amount: number }).amount,
        ])
      })
      kinds.push(result.kind)
    }
    return kinds
  }

  async function effectsFor(ids: string[]) {
    const { rows } = await db.pool.query<{ message_id: string; n: number }>(
      'SELECT message_id, count(*)::int AS n FROM effects WHERE message_id = ANY($1) GROUP BY message_id',
      [ids],
    )
    return rows
  }

  it('a dispatcher SIGKILLed between publish and mark publishes no duplicate a consumer acts on', async () => {
    const topic = `${subject}.killed`
    const ids = await enqueueOrders(topic, 3)
    const child = spawnTsx(new URL('fixtures/dispatch-then-die.ts', import.meta.url), [], {
      env: { ...process.env, DATABASE_URL: db.url, NATS_URL: nats.url },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    child.stderr.on('data', (chunk) => (stderr += chunk))
    const signal = await new Promise((resolve) => child.on('exit', (_code, sig) => resolve(sig)))
    expect(signal, stderr).toBe('SIGKILL')
    expect(stdout.trim()).toBe(`published ${ids[0]}`)
    // The row is still pending and claimed by the dead dispatcher; the survivor takes it over after the lease.
    const pending = await db.pool.query(
      "SELECT count(*)::int AS n FROM oncely.outbox WHERE topic = $1 AND status = 'pending'",
      [topic],
    )
    expect(pending.rows[0].n).toBe(3)

    const survivor = createDispatcher({
      pool: db.pool,
      publisher: jetStreamPublisher({ js: jetstream(nc) }),
      pollIntervalMs: 50,
    })
    survivor.start()
    const kinds = await drain(topic, 'killed', 3)
    await survivor.stop()

    const attempts = await db.pool.query(
      'SELECT id, status, attempts FROM oncely.outbox WHERE topic = $1 ORDER BY seq',
      [topic],
    )
    expect(attempts.rows).toEqual([
      { id: ids[0], status: 'published', attempts: 2 }, // published twice: once by the dead dispatcher
      { id: ids[1], status: 'published', attempts: 1 },
      { id: ids[2], status: 'published', attempts: 1 },
    ])
    const state = await jsm.streams.info(stream, { subjects_filter: topic })
    expect(state.state.subjects?.[topic]).toBe(3) // JetStream dropped the re-publish (same Nats-Msg-Id)
    expect(kinds).toEqual(['processed', 'processed', 'processed'])
    expect(await effectsFor(ids)).toHaveLength(3)
    expect((await effectsFor(ids)).every((row) => row.n === 1)).toBe(true)
  })

  it('a consumer that dies between commit and ack makes one effect: the redelivery is a no-op', async () => {
    const topic = `${subject}.consumer`
    const ids = await enqueueOrders(topic, 2)
    const dispatcher = createDispatcher({
      pool: db.pool,
      publisher: jetStreamPublisher({ js: jetstream(nc) }),
    })
    expect(await dispatcher.dispatchOnce()).toBe(1) // one message per aggregate per round
    expect(await dispatcher.dispatchOnce()).toBe(1)
    const kinds = await drain(topic, 'consumer', 2, new Set([ids[0] as string]))
    expect(kinds[0]).toBe('processed (no ack)')
    expect(kinds).toContain('duplicate') // the redelivery of ids[0], acked this time
    expect(kinds.filter((k) => k === 'processed')).toHaveLength(1)
    expect((await effectsFor(ids)).map((row) => row.n)).toEqual([1, 1])
  })

  it('a re-publish after the duplicate window expired is still a no-op for the inbox', async () => {
    const short = `${stream}_SHORT`
    const topic = `oncely.short.${stream}`
    await jsm.streams.add({ name: short, subjects: [topic], duplicate_window: nanos(200) })
    try {
      const ids = await enqueueOrders(topic, 1)
      const js = jetstream(nc)
      const dispatcher = createDispatcher({ pool: db.pool, publisher: jetStreamPublisher({ js }) })
      await dispatcher.dispatchOnce()
      await new Promise((resolve) => setTimeout(resolve, 400))
      // The dispatcher's copy after a long stall: same Nats-Msg-Id, but JetStream has forgotten it.
      const [row] = (await db.pool.query('SELECT * FROM oncely.outbox WHERE id = $1', [ids[0]])).rows
      const again = await jetStreamPublisher({ js }).publish({
        id: row.id,
        topic: row.topic,
        payload: row.payload,
        headers: row.headers,
        aggregateKey: row.aggregate_key,
        attempt: 2,
        createdAt: row.created_at,
      })
      expect(again).toBeUndefined()
      expect((await jsm.streams.info(short)).state.messages).toBe(2)
      const kinds = await drain(topic, 'late', 2, new Set(), short)
      expect(kinds).toEqual(['processed', 'duplicate'])
      expect((await effectsFor(ids)).map((r) => r.n)).toEqual([1])
    } finally {
      await jsm.streams.delete(short).catch(() => {})
    }
  })

  /**
   * Publishes `bodies` as one message id (the header an outbox publisher sets) to a fresh subject of a stream whose
   * duplicate window is short, so the copies are stored, and returns a pull consumer on it.
   */
  async function redeliveredAs(name: string, bodies: string[], messageId: string) {
    const topic = `oncely.raw.${stream}.${name}`
    await jsm.streams.add({
      name: `${stream}_${name.replace(/\W/g, '_')}`,
      subjects: [topic],
      duplicate_window: nanos(100),
    })
    const js = jetstream(nc)
    for (const body of bodies) {
      await js.publish(topic, body, { msgID: messageId })
      await new Promise((resolve) => setTimeout(resolve, 300)) // past the duplicate window
    }
    const streamName = await jsm.streams.find(topic)
    await jsm.consumers.add(streamName, {
      durable_name: name,
      filter_subject: topic,
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(30_000),
    })
    return { consumer: await js.consumers.get(streamName, name), topic, streamName }
  }

  async function consumeEach(
    name: string,
    bodies: string[],
    options: JetStreamConsumeOptions = {},
  ): Promise<{
    kinds: string[]
    events: InboxEvent[]
    consumer: Consumer
    messageId: string
    topic: string
  }> {
    const messageId = freshKey(name)
    const { consumer, topic, streamName } = await redeliveredAs(name, bodies, messageId)
    extraStreams.push(streamName)
    const { engine } = engineFor(db.pool)
    const events: InboxEvent[] = []
    const inbox = createInbox({ engine, consumer: 'billing', onEvent: (event) => events.push(event) })
    const kinds: string[] = []
    for (let n = 0; n < bodies.length; n++) {
      const msg = await consumer.next({ expires: 2_000 })
      if (!msg) throw new Error(`message ${n} of ${name} was not delivered`)
      const result = await consumeJetStreamMessage(
        inbox,
        msg,
        async ({ tx }, data) => {
          await tx.query('INSERT INTO effects VALUES ($1, $2)', [
            messageId,
            (data as { amount: number }).amount,
          ])
        },
        options,
      )
      kinds.push(result.kind)
    }
    return { kinds, events, consumer, messageId, topic }
  }

  it('JSON data re-serialised with its members in another order is a duplicate', async () => {
    const { kinds, events, messageId } = await consumeEach('reordered', [
      '{"amount":5,"currency":"eur"}',
      '{ "currency": "eur", "amount": 5 }',
    ])
    expect(kinds).toEqual(['processed', 'duplicate'])
    expect(events).toEqual([])
    expect((await effectsFor([messageId])).map((row) => row.n)).toEqual([1])
  })

  it('a mismatched message is reported and stays in the stream by default: nak with a delay, redelivered', async () => {
    const { kinds, events, consumer, messageId, topic } = await consumeEach(
      'mismatch-nak',
      ['{"amount":5}', '{"amount":6}'],
      { mismatchDelayMs: 500 },
    )
    expect(kinds).toEqual(['processed', 'mismatch'])
    expect(events).toEqual([{ type: 'mismatch', consumer: 'billing', topic, messageId }])
    const again = await consumer.next({ expires: 5_000 })
    expect(again?.info.deliveryCount).toBe(2) // the same message, back after the delay
    expect(again?.json()).toEqual({ amount: 6 })
    again?.term()
    expect((await effectsFor([messageId])).map((row) => row.n)).toEqual([1])
  })

  it('onMismatch: term stops the redelivery of a mismatched message', async () => {
    const { kinds, consumer } = await consumeEach('mismatch-term', ['{"amount":5}', '{"amount":6}'], {
      onMismatch: 'term',
      mismatchDelayMs: 200,
    })
    expect(kinds).toEqual(['processed', 'mismatch'])
    expect(await pullNext(consumer, 1_500)).toBeNull()
  })

  it('validates its options with a TypeError naming the option', async () => {
    const call = (options: JetStreamConsumeOptions) =>
      consumeJetStreamMessage({} as never, {} as never, async () => 1, options)
    await expect(call({ onMismatch: 'ack' as never })).rejects.toThrow(
      "Expected `onMismatch` to be 'nak' or 'term'",
    )
    await expect(call({ onReject: 'nak' as never })).rejects.toThrow(
      "Expected `onReject` to be 'term' or 'ack'",
    )
    await expect(call({ mismatchDelayMs: 0 })).rejects.toThrow(
      'Expected `mismatchDelayMs` to be a positive integer',
    )
  })

  it('a publish to a subject no stream covers names the subject and the fix', async () => {
    const publisher = jetStreamPublisher({ js: jetstream(nc), timeoutMs: 2_000 })
    const orphan = `oncely.nostream.${stream}`
    const error = await publisher
      .publish({
        id: '00000000-0000-4000-8000-000000000001',
        topic: orphan,
        payload: {},
        headers: {},
        aggregateKey: null,
        attempt: 1,
        createdAt: new Date(),
      })
      .catch((e: unknown) => e)
    expect(error).toBeInstanceOf(NoStreamForSubjectError)
    expect((error as NoStreamForSubjectError).subject).toBe(orphan)
    expect((error as Error).message).toContain(`No JetStream stream covers the subject "${orphan}"`)
    expect((error as Error).message).toContain('jsm.streams.add')
    expect(((error as Error).cause as Error).name).toBe('JetStreamNotEnabled')
  })
})
