/**
 * An inbox consumer process for the layer chaos scenario: pulls from a durable JetStream consumer and records one
 * effect row per message through `createInbox` + `consumeJetStreamMessage`, which acks only after the commit. With
 * `DIE_AFTER_COMMITS=n` it SIGKILLs itself after committing its n-th new effect and before acking it, so JetStream
 * redelivers a message whose effect already exists.
 * Env: DATABASE_URL, NATS_URL, STREAM, DURABLE, DIE_AFTER_COMMITS (0: never). Lines: `ready`,
 * `consumed <id> <kind>`, `ONCELY_CHAOS crash after-commit`. SIGTERM stops it cleanly.
 */
import { jetstream } from '@nats-io/jetstream'
import { connect } from '@nats-io/transport-node'
import { createEngine, postgresStore } from '@oncely/server'
import { createInbox } from '@oncely/server/inbox'
import { consumeJetStreamMessage } from '@oncely/server/nats'
import { pullNext } from '@oncely/test-support'
import pg from 'pg'

const dieAfter = Number(process.env.DIE_AFTER_COMMITS ?? 0)
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 4 })
const nc = await connect({ servers: process.env.NATS_URL })
// A short lease, so a delivery that died mid-transaction is taken over by its redelivery within the run.
const engine = createEngine({ store: postgresStore({ pool }), leaseMs: 1_000 })
const inbox = createInbox({ engine, consumer: 'chaos-billing' })
const consumer = await jetstream(nc).consumers.get(process.env.STREAM ?? '', process.env.DURABLE ?? '')
const effect = async (tx: pg.PoolClient, messageId: string) => {
  await tx.query('INSERT INTO effects (message_id, pid) VALUES ($1, $2)', [messageId, process.pid])
}
let stopping = false
process.once('SIGTERM', () => {
  stopping = true
})
process.stdout.write('ready\n')
let committed = 0
while (!stopping) {
  const msg = await pullNext(consumer, 1_000)
  if (!msg) continue
  const id = msg.headers?.get('Nats-Msg-Id') ?? ''
  if (dieAfter > 0 && committed + 1 === dieAfter) {
    // The armed delivery: commit through the inbox, then die before the ack.
    const result = await inbox.consume({
      messageId: id,
      topic: msg.subject,
      payload: msg.data,
      handler: ({ tx }) => effect(tx, id),
    })
    process.stdout.write(`consumed ${id} ${result.kind}\n`)
    if (result.kind === 'processed') {
      process.stdout.write('ONCELY_CHAOS crash after-commit\n')
      process.kill(process.pid, 'SIGKILL')
    }
    if (result.kind === 'duplicate') msg.ack()
    else msg.nak(100)
    continue
  }
  const result = await consumeJetStreamMessage(inbox, msg, ({ tx, messageId }) => effect(tx, messageId))
  if (result.kind === 'processed') committed++
  process.stdout.write(`consumed ${id} ${result.kind}\n`)
}
await nc.close()
await pool.end()
process.exit(0)
