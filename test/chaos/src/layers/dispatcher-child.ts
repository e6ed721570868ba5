/**
 * An outbox dispatcher process for the layer chaos scenario. With `DIE_AFTER_PUBLISHES=n` it SIGKILLs itself right
 * after its n-th publish, before marking the row published: the crash window the outbox must survive.
 * Env: DATABASE_URL, NATS_URL, DIE_AFTER_PUBLISHES (0: never). Lines: `ready`, `published <id> <attempt>`,
 * `ONCELY_CHAOS crash after-publish`. SIGTERM stops it cleanly.
 */
import { jetstream } from '@nats-io/jetstream'
import { connect } from '@nats-io/transport-node'
import { jetStreamPublisher } from '@oncely/server/nats'
import { createDispatcherForTesting } from '@oncely/server/testing'
import pg from 'pg'

const dieAfter = Number(process.env.DIE_AFTER_PUBLISHES ?? 0)
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 4 })
const nc = await connect({ servers: process.env.NATS_URL })
let published = 0
const dispatcher = createDispatcherForTesting({
  pool,
  publisher: jetStreamPublisher({ js: jetstream(nc) }),
  leaseMs: 1_000,
  batchSize: 4,
  pollIntervalMs: 100,
  retryDelayMs: () => 100,
  hooks: {
    afterPublish: (message) => {
      process.stdout.write(`published ${message.id} ${message.attempt}\n`)
      if (++published === dieAfter) {
        process.stdout.write('ONCELY_CHAOS crash after-publish\n')
        process.kill(process.pid, 'SIGKILL')
      }
    },
  },
})
dispatcher.start()
process.stdout.write('ready\n')
process.once('SIGTERM', async () => {
  await dispatcher.stop()
  await nc.close()
  await pool.end()
  process.exit(0)
})
