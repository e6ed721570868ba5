import type { PoolClient } from 'pg'
import type { Engine, ErrorClass } from '../engine/types.js'
import { traceHeadersFrom } from '../hooks.js'
import { type ConsumeResult, createInbox, type MessageContext } from '../inbox/inbox.js'
import { nonEmptyString, objectOptions, optionalFunction } from '../options/check.js'
import { SIGNATURE_HEADER, verifySignature } from './signature.js'

// Strict: decoded leniently, ids differing only in invalid bytes would read alike (U+FFFD) and count as one event.
const utf8 = new TextDecoder('utf-8', { fatal: true })

/** Options of {@link createWebhookReceiver}. */
export interface WebhookReceiverOptions<Tx = PoolClient> {
  /**
   * The engine whose table records event ids. Give it `reservation: 'lock'`: an event then belongs to a delivery only
   * while its transaction lives, so when the process handling it dies the provider's next retry is applied at once;
   * under `'row'` it is answered 409 until the dead delivery's lease runs out.
   */
  engine: Engine<Tx>
  /** The sender's name (`stripe`, `github`): the records' scope, so two providers' event ids never collide. */
  provider: string
  /** The shared secret(s) for the built-in `t=…,v1=…` HMAC-SHA256 scheme (what `webhookPublisher` sends). */
  secret?: string | readonly string[]
  /**
   * Your own check for another provider's scheme (call its SDK here). Replaces the built-in check.
   * @example (rawBody, headers) => { stripe.webhooks.constructEvent(rawBody, headers['stripe-signature'], secret); return true }
   */
  verify?: (
    rawBody: Buffer,
    headers: Record<string, string | string[] | undefined>,
  ) => boolean | Promise<boolean>
  /** Largest accepted clock distance for the built-in check, in seconds. @default 300 */
  toleranceSec?: number
  /** The event id inside the parsed body. @default (event) => event.id */
  eventId?: (event: unknown) => unknown
  /**
   * How long an event id is remembered: longer than the provider's retry schedule (Stripe retries for 3 days).
   * @default 604_800_000 (7 days)
   */
  retentionMs?: number
  /** Which handler errors are permanent (stored, answered 200 so the provider stops) rather than retryable. @default () => 'retryable' */
  classify?: (error: unknown) => ErrorClass
}

/** What a delivery came to: the inbox results plus the two ways a request can be refused before the engine. */
export type WebhookResult<T = unknown> =
  | ConsumeResult<T>
  | { kind: 'invalid_signature' }
  | { kind: 'invalid_payload'; detail: string }

/** One incoming webhook request. */
export interface WebhookDelivery<T, Tx = PoolClient> {
  /** The body bytes exactly as received (configure your framework to keep them). */
  rawBody: Buffer
  /** The request headers (lower-case names, as Node gives them). */
  headers: Record<string, string | string[] | undefined>
  /** The effect, on `ctx.tx`, given the parsed event. */
  handler: (event: unknown, ctx: MessageContext<Tx>) => Promise<T>
}

/** Receives webhooks once per provider event id. Create with {@link createWebhookReceiver}. */
export interface WebhookReceiver<Tx = PoolClient> {
  receive<T = unknown>(delivery: WebhookDelivery<T, Tx>): Promise<WebhookResult<T>>
}

/**
 * The HTTP status to answer a webhook delivery with:
 *
 * - 200 for `processed`, `duplicate` (handled before) and `rejected` (a stored permanent failure): the provider
 *   stops retrying.
 * - 400 for `invalid_payload` (the body is not JSON in UTF-8, or the event has no id) and `mismatch` (never
 *   produced by the receiver, which does not fingerprint payloads).
 * - 401 for `invalid_signature` (missing, malformed, stale or forged).
 * - 409 for `busy` (another delivery of the event is running) and 503 for `failed` (the handler failed retryably)
 *   and `unavailable` (the database): the provider retries later.
 *
 * @example
 * reply.code(webhookStatus(result)).send()
 */
export function webhookStatus(result: WebhookResult): number {
  switch (result.kind) {
    case 'processed':
    case 'duplicate':
    case 'rejected':
      return 200
    case 'invalid_signature':
      return 401
    case 'invalid_payload':
    case 'mismatch':
      return 400
    case 'busy':
      return 409
    default:
      return 503
  }
}

/**
 * A webhook receiver on the engine: verify the signature first (before any database work), then record the
 * provider's event id in the same transaction as the handler's effect (scope = provider, key = event id), so a
 * redelivered event is acknowledged without running again.
 *
 * @example
 * const receiver = createWebhookReceiver({ engine, provider: 'partner', secret })
 * app.post('/hooks/partner', async (req, reply) => {
 *   const result = await receiver.receive({ rawBody: req.rawBody, headers: req.headers, handler: async (event, { tx }) => {
 *     await tx.query('UPDATE orders SET paid = true WHERE id = $1', [event.payload.orderId])
 *   } })
 *   return reply.code(webhookStatus(result)).send()
 * })
 */
export function createWebhookReceiver<Tx = PoolClient>(
  options: WebhookReceiverOptions<Tx>,
): WebhookReceiver<Tx> {
  objectOptions('createWebhookReceiver()', options)
  const { secret } = options
  const verify = optionalFunction('verify', options.verify)
  if (verify === undefined && secret === undefined) throw new TypeError('Expected `secret` or `verify`.')
  // The provider names the inbox's consumer: checked here so that the message names this option, not the inbox's.
  nonEmptyString('provider', options.provider)
  const eventId =
    optionalFunction('eventId', options.eventId) ??
    ((event: unknown) => (event as { id?: unknown } | null)?.id)
  const inbox = createInbox<Tx>({
    engine: options.engine,
    consumer: options.provider,
    retentionMs: options.retentionMs ?? 604_800_000,
    ...(options.classify === undefined ? {} : { classify: options.classify }),
  })
  const check =
    verify ??
    ((rawBody: Buffer, headers: Record<string, string | string[] | undefined>) => {
      const header = headers[SIGNATURE_HEADER]
      return verifySignature(rawBody, typeof header === 'string' ? header : undefined, {
        secret: secret as string | readonly string[],
        ...(options.toleranceSec === undefined ? {} : { toleranceSec: options.toleranceSec }),
      })
    })

  return {
    async receive<T>(delivery: WebhookDelivery<T, Tx>): Promise<WebhookResult<T>> {
      if (!Buffer.isBuffer(delivery?.rawBody)) throw new TypeError('Expected `rawBody` to be a Buffer.')
      if (!(await check(delivery.rawBody, delivery.headers ?? {}))) return { kind: 'invalid_signature' }
      let event: unknown
      try {
        event = JSON.parse(utf8.decode(delivery.rawBody))
      } catch {
        return { kind: 'invalid_payload', detail: 'The body is not JSON in UTF-8.' }
      }
      const id = eventId(event)
      if (typeof id !== 'string' || id === '')
        return { kind: 'invalid_payload', detail: 'The event has no id.' }
      // No payload fingerprint: providers legitimately change fields between redeliveries of one event.
      return inbox.consume({
        messageId: id,
        topic: 'webhook',
        handler: (ctx) => delivery.handler(event, ctx),
        headers: traceHeadersFrom((name) => {
          const value = delivery.headers?.[name]
          return typeof value === 'string' ? value : undefined
        }),
      })
    },
  }
}
