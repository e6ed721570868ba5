import type { JsMsg } from '@nats-io/jetstream'
import { canonicalJson, type JsonValue, parseStrictJson } from '@oncely/protocol'
import { traceHeadersFrom } from '../hooks.js'
import type { ConsumeResult, Inbox, MessageContext } from '../inbox/inbox.js'
import { objectOptions, oneOf, positiveInteger } from '../options/check.js'

/** Options of {@link consumeJetStreamMessage}. */
export interface JetStreamConsumeOptions {
  /**
   * What to do with a message whose id was consumed before with another payload (`mismatch`; the inbox has already
   * reported it through its `onEvent`). Nothing of it was applied, and only an operator can tell which payload is
   * right, so by default it stays in the stream:
   *
   * - `'nak'`: redelivered after `mismatchDelayMs`, until it is applied (once the operator deleted the inbox record)
   *   or the consumer's `max_deliver` runs out; JetStream then publishes a `MAX_DELIVERIES` advisory and keeps the
   *   message in the stream (under limits retention), where it can still be read by its sequence.
   * - `'term'`: no more redeliveries; JetStream publishes a `TERMINATED` advisory naming the reason.
   * @default 'nak'
   */
  onMismatch?: 'nak' | 'term'
  /** Delay before a mismatched message comes back, with `onMismatch: 'nak'`. @default 60_000 */
  mismatchDelayMs?: number
  /**
   * What to do with a message whose stored outcome is a permanent failure (`rejected`: the handler threw an error
   * your `classify` called permanent; the error is stored with the record): `term` stops redelivery (JetStream
   * publishes a `TERMINATED` advisory), `ack` drops it.
   * @default 'term'
   */
  onReject?: 'term' | 'ack'
}

const decoder = new TextDecoder('utf-8', { fatal: true })

/**
 * The message's data as the inbox fingerprints it: the parsed value when the data is strict JSON (so a relay that
 * re-serialises the message with its members in another order does not make it a mismatch), else the bytes as
 * received (not UTF-8, not JSON, or JSON that cannot be compared as a value: duplicate member names, integers beyond
 * 2^53).
 */
function decode(data: Uint8Array): { value: JsonValue } | undefined {
  if (data.length === 0) return undefined
  try {
    return { value: parseStrictJson(decoder.decode(data)) }
  } catch {
    return undefined
  }
}

function checkOptions(options: JetStreamConsumeOptions): {
  onMismatch: 'nak' | 'term'
  mismatchDelayMs: number
  onReject: 'term' | 'ack'
} {
  objectOptions('consumeJetStreamMessage()', options)
  const onMismatch = oneOf('onMismatch', options.onMismatch ?? 'nak', ['nak', 'term'])
  const onReject = oneOf('onReject', options.onReject ?? 'term', ['term', 'ack'])
  const mismatchDelayMs = positiveInteger('mismatchDelayMs', options.mismatchDelayMs ?? 60_000)
  return { onMismatch, mismatchDelayMs, onReject }
}

/**
 * Consumes one JetStream message through an inbox and acknowledges it only after the handler's transaction
 * committed (or the message proved to be a duplicate). A crash anywhere before the ack leads to a redelivery, which
 * the inbox turns into a no-op. Failures are nak'ed with the advised delay. The message id is the `Nats-Msg-Id`
 * header (the outbox id), else `<stream>:<stream sequence>`. JSON data is fingerprinted as a value (member order
 * does not matter), any other data as its bytes.
 *
 * @example
 * for await (const msg of await consumer.consume()) {
 *   await consumeJetStreamMessage(inbox, msg, async ({ tx }, data) => {
 *     await tx.query('INSERT INTO invoices (order_id) VALUES ($1)', [(data as { orderId: string }).orderId])
 *   })
 * }
 */
export async function consumeJetStreamMessage<T = unknown>(
  inbox: Inbox,
  msg: JsMsg,
  handler: (ctx: MessageContext, data: unknown, msg: JsMsg) => Promise<T>,
  options: JetStreamConsumeOptions = {},
): Promise<ConsumeResult<T>> {
  const { onMismatch, mismatchDelayMs, onReject } = checkOptions(options)
  const messageId = msg.headers?.get('Nats-Msg-Id') || `${msg.info.stream}:${msg.seq}`
  const json = decode(msg.data)
  const result = await inbox.consume<T>({
    messageId,
    topic: msg.subject,
    // Canonical JSON text hashes like the value it encodes (see `ConsumeInput.payload`).
    payload: json ? canonicalJson(json.value) : msg.data,
    handler: (ctx) => handler(ctx, json ? json.value : msg.data.length === 0 ? undefined : msg.json(), msg),
    headers: msg.headers ? traceHeadersFrom((name) => msg.headers?.get(name)) : undefined,
  })
  switch (result.kind) {
    case 'processed':
    case 'duplicate':
      msg.ack()
      break
    case 'rejected':
      if (onReject === 'ack') msg.ack()
      else msg.term('oncely: rejected (a stored permanent failure)')
      break
    case 'mismatch':
      if (onMismatch === 'term') msg.term('oncely: mismatch (the id was consumed with another payload)')
      else msg.nak(mismatchDelayMs)
      break
    default:
      msg.nak(result.retryAfterMs)
  }
  return result
}
