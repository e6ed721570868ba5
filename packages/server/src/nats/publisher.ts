import type { JetStreamClient } from '@nats-io/jetstream'
import { headers as natsHeaders } from '@nats-io/transport-node'
import { NoStreamForSubjectError } from '../errors/no-stream-for-subject-error.js'
import { hasMethods, objectOptions, optionalFunction, positiveInteger } from '../options/check.js'
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
 * A subject that no stream covers fails the attempt with a {@link NoStreamForSubjectError} (the dispatcher retries it
 * and keeps the message in its `last_error`).
 *
 * @example
 * const js = jetstream(await connect({ servers: 'nats://127.0.0.1:4222' }))
 * createDispatcher({ pool, publisher: jetStreamPublisher({ js }) }).start()
 */
export function jetStreamPublisher(options: JetStreamPublisherOptions): Publisher {
  objectOptions('jetStreamPublisher()', options)
  hasMethods('js', options.js, ['publish'], 'a JetStream client')
  const subject = optionalFunction('subject', options.subject) ?? ((message: OutboxMessage) => message.topic)
  const timeout = positiveInteger('timeoutMs', options.timeoutMs ?? 5_000)
  return {
    async publish(message) {
      const h = natsHeaders()
      for (const [name, value] of Object.entries(message.headers)) h.set(name, value)
      if (message.aggregateKey !== null) h.set('Oncely-Aggregate-Key', message.aggregateKey)
      const to = subject(message)
      try {
        await options.js.publish(to, JSON.stringify(message.payload), {
          msgID: message.id,
          timeout,
          headers: h,
        })
      } catch (error) {
        // "No responders" on a publish: nothing listens on the subject, which almost always means no stream covers it.
        if ((error as Error | null)?.name === 'JetStreamNotEnabled') {
          throw new NoStreamForSubjectError(to, { cause: error })
        }
        throw error
      }
    },
  }
}
