import type { JetStreamClient } from '@nats-io/jetstream'
import { headers as natsHeaders } from '@nats-io/transport-node'
import type { OutboxMessage, Publisher } from '../outbox/types.js'

/** Options of {@link jetStreamPublisher}. */
export interface JetStreamPublisherOptions {
  /** A JetStream client: `jetstream(await connect({ servers }))`. */
  js: JetStreamClient
  /** The subject per message. @default (message) => message.topic */
  subject?: (message: OutboxMessage) => string
  /** Time to wait for the stream's PubAck. @default 5_000 */
  timeoutMs?: number
}

/**
 * Publishes outbox messages to JetStream with the outbox id as `Nats-Msg-Id`. A dispatcher that crashed after the
 * publish but before marking the row publishes it again; the stream drops that copy as a duplicate as long as it
 * arrives within the stream's `duplicate_window` (2 minutes by default: keep the dispatcher's `leaseMs` well below
 * it). Past the window, the consumer's inbox still makes the copy a no-op.
 *
 * @example
 * const js = jetstream(await connect({ servers: 'nats://127.0.0.1:4222' }))
 * createDispatcher({ pool, publisher: jetStreamPublisher({ js }) }).start()
 */
export function jetStreamPublisher(options: JetStreamPublisherOptions): Publisher {
  if (typeof options?.js?.publish !== 'function')
    throw new TypeError('Expected `js` to be a JetStream client.')
  const subject = options.subject ?? ((message: OutboxMessage) => message.topic)
  if (typeof subject !== 'function') throw new TypeError('Expected `subject` to be a function.')
  const timeout = options.timeoutMs ?? 5_000
  if (!Number.isSafeInteger(timeout) || timeout <= 0) {
    throw new TypeError(`Expected \`timeoutMs\` to be a positive integer, got ${String(timeout)}.`)
  }
  return {
    async publish(message) {
      const h = natsHeaders()
      for (const [name, value] of Object.entries(message.headers)) h.set(name, value)
      if (message.aggregateKey !== null) h.set('Oncely-Aggregate-Key', message.aggregateKey)
      await options.js.publish(subject(message), JSON.stringify(message.payload), {
        msgID: message.id,
        timeout,
        headers: h,
      })
    },
  }
}
