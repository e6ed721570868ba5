import type { JsMsg } from '@nats-io/jetstream'
import type { ConsumeResult, Inbox, MessageContext } from '../inbox/inbox.js'

/** Options of {@link consumeJetStreamMessage}. */
export interface JetStreamConsumeOptions {
  /**
   * What to do with a message whose id was consumed before with another payload, or whose stored outcome is a
   * permanent failure: `term` stops redelivery (JetStream emits a terminated advisory), `ack` drops it silently.
   * @default 'term'
   */
  onReject?: 'term' | 'ack'
}

/**
 * Consumes one JetStream message through an inbox and acknowledges it only after the handler's transaction
 * committed (or the message proved to be a duplicate). A crash anywhere before the ack leads to a redelivery, which
 * the inbox turns into a no-op. Failures are nak'ed with the advised delay. The message id is the `Nats-Msg-Id`
 * header (the outbox id), else `<stream>:<stream sequence>`.
 *
 * @example
 * for await (const msg of await consumer.consume()) {
 *   await consumeJetStreamMessage(inbox, msg, async ({ tx }, data) => {
 *     await tx.query('INSERT INTO invoices (order_id) VALUES ($1)', [data.orderId])
 *   })
 * }
 */
export async function consumeJetStreamMessage<T = unknown>(
  inbox: Inbox,
  msg: JsMsg,
  handler: (ctx: MessageContext, data: unknown, msg: JsMsg) => Promise<T>,
  options: JetStreamConsumeOptions = {},
): Promise<ConsumeResult<T>> {
  const messageId = msg.headers?.get('Nats-Msg-Id') || `${msg.info.stream}:${msg.seq}`
  const result = await inbox.consume<T>({
    messageId,
    topic: msg.subject,
    payload: msg.data,
    handler: (ctx) => handler(ctx, msg.data.length === 0 ? undefined : msg.json(), msg),
  })
  switch (result.kind) {
    case 'processed':
    case 'duplicate':
      msg.ack()
      break
    case 'rejected':
    case 'mismatch':
      if (options.onReject === 'ack') msg.ack()
      else msg.term(`oncely: ${result.kind}`)
      break
    default:
      msg.nak(result.retryAfterMs)
  }
  return result
}
