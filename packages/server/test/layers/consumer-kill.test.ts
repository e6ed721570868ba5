import { AckPolicy, type JetStreamManager, jetstream, jetstreamManager } from '@nats-io/jetstream'
import { connect, type NatsConnection, nanos } from '@nats-io/transport-node'
import type { TestDatabase } from '@oncely/test-support'
import { optionalService, pullNext, spawnTsx } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createInbox } from '../../src/inbox/index.js'
import { consumeJetStreamMessage } from '../../src/nats/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

const nats = await optionalService('NATS_URL', 'nats://127.0.0.1:4222')
if (nats.skip) console.warn(`skipping the SIGKILLed-consumer tests: ${nats.skip}`)

/** JetStream redelivers an unacknowledged message this long after delivering it. */
const ACK_WAIT_MS = 1_000
/** The row protocol's lease in this test: short to keep it quick; the engine's default is 30 s. */
const ROW_LEASE_MS = 4_000

describe.skipIf(nats.skip)('a consumer SIGKILLed mid-message', () => {
  let db: TestDatabase
  let nc: NatsConnection
  let jsm: JetStreamManager
  const stream = `ONCELY_KILL_${freshKey('s').replace(/[^A-Za-z0-9]/g, '_')}`
  const subject = `oncely.kill.${stream}`

  beforeAll(async () => {
    db = await setupDatabase('consumer_kill')
    await db.pool.query('CREATE TABLE effects (message_id text NOT NULL)')
    nc = await connect({ servers: nats.url })
    jsm = await jetstreamManager(nc)
    await jsm.streams.add({ name: stream, subjects: [`${subject}.>`] })
  })
  afterAll(async () => {
    await jsm?.streams.delete(stream).catch(() => {})
    await nc?.close()
    await db?.drop()
  })

  /**
   * Publishes one message, lets a child process consume it and SIGKILLs the child inside the handler, then consumes
   * in this process until the message is applied. Returns what the redeliveries answered and how long after the
   * SIGKILL the message was applied.
   */
  async function killMidMessage(reservation: 'row' | 'lock') {
    const durable = `kill_${reservation}`
    const topic = `${subject}.${reservation}`
    const messageId = freshKey(`order-${reservation}`)
    await jetstream(nc).publish(topic, JSON.stringify({ orderId: messageId }), { msgID: messageId })
    await jsm.consumers.add(stream, {
      durable_name: durable,
      filter_subject: topic,
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(ACK_WAIT_MS),
    })

    const child = spawnTsx(new URL('fixtures/consume-and-hang.ts', import.meta.url), [], {
      env: {
        ...process.env,
        DATABASE_URL: db.url,
        NATS_URL: nats.url,
        STREAM: stream,
        DURABLE: durable,
        RESERVATION: reservation,
        LEASE_MS: String(ROW_LEASE_MS),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let stderr = ''
    child.stderr.on('data', (chunk) => (stderr += chunk))
    const exited = new Promise((resolve) => child.on('exit', (_code, signal) => resolve(signal)))
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`the child never handled the message:\n${stderr}`)),
        30_000,
      )
      child.stdout.on('data', (chunk: Buffer) => {
        if (!chunk.toString().includes(`handling ${messageId}`)) return
        clearTimeout(timer)
        resolve()
      })
    })
    child.kill('SIGKILL')
    const killedAt = Date.now()
    expect(await exited).toBe('SIGKILL')

    const { engine } = engineFor(db.pool, { reservation, leaseMs: ROW_LEASE_MS })
    const inbox = createInbox({ engine, consumer: 'billing' })
    const consumer = await jetstream(nc).consumers.get(stream, durable)
    const answers: string[] = []
    let appliedAfterMs: number | undefined
    const deadline = Date.now() + ROW_LEASE_MS + 20_000
    while (appliedAfterMs === undefined && Date.now() < deadline) {
      const msg = await pullNext(consumer, 1_000)
      if (!msg) continue
      const result = await consumeJetStreamMessage(inbox, msg, async ({ tx }) => {
        await tx.query('INSERT INTO effects VALUES ($1)', [messageId])
      })
      answers.push(result.kind)
      if (result.kind === 'processed') appliedAfterMs = Date.now() - killedAt
    }
    const effects = await db.pool.query('SELECT count(*)::int AS n FROM effects WHERE message_id = $1', [
      messageId,
    ])
    console.info(
      `reservation '${reservation}': redelivery applied ${appliedAfterMs} ms after the SIGKILL (ack_wait ${ACK_WAIT_MS} ms, lease ${ROW_LEASE_MS} ms); deliveries after the kill: ${answers.join(', ')}`,
    )
    return { answers, appliedAfterMs, effects: effects.rows[0].n as number }
  }

  it("under reservation: 'lock' the first redelivery is applied: the dead process's transaction took the key with it", async () => {
    const { answers, appliedAfterMs, effects } = await killMidMessage('lock')
    expect(answers).toEqual(['processed'])
    expect(appliedAfterMs).toBeDefined()
    expect(effects).toBe(1)
  })

  it("under reservation: 'row' the redeliveries answer busy until the dead process's lease runs out", async () => {
    const { answers, appliedAfterMs, effects } = await killMidMessage('row')
    expect(answers.at(-1)).toBe('processed')
    expect(answers.slice(0, -1).length).toBeGreaterThan(0)
    expect(answers.slice(0, -1).every((kind) => kind === 'busy')).toBe(true)
    expect(appliedAfterMs).toBeDefined()
    expect(effects).toBe(1)
  })
})
