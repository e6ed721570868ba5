import { createHash } from 'node:crypto'
import { canonicalJson } from '@oncely/protocol'
import type pg from 'pg'
import type { Engine, ErrorClass, ExecuteInput, Outcome } from '../engine/types.js'
import { INBOX_DELIVERY, type MarkedInput } from '../hooks.js'
import {
  engineOption,
  nonEmptyString,
  objectOptions,
  optionalFunction,
  positiveInteger,
  requiredFunction,
} from '../options/check.js'

/** What a message handler receives. */
export interface MessageContext<Tx = pg.PoolClient> {
  /** The open transaction in which the inbox record completes too. Do every effect on it; never COMMIT it. */
  tx: Tx
  messageId: string
  topic: string
  /** 1 on the first delivery that ran the handler, higher after a failed or abandoned one. */
  attempt: number
  /** A deterministic key for an external call made while handling this message (see `ExecutionContext.stepKey`). */
  stepKey(step: string): string
  signal: AbortSignal
}

/**
 * What happened to one delivery, and what to tell the broker:
 * `processed` and `duplicate` → ack; `rejected` → ack or dead-letter (a stored permanent failure, replayed on every
 * redelivery); `busy`, `failed`, `unavailable` → nak with `retryAfterMs` (the message must be delivered again);
 * `mismatch` → the id was already used for another payload: nothing was applied and the inbox reported it (see
 * {@link InboxOptions.onEvent}); keep the message for an operator (a delayed nak, a dead-letter subject).
 */
export type ConsumeResult<T = unknown> =
  | { kind: 'processed'; result: T }
  | { kind: 'duplicate'; result: T }
  | { kind: 'rejected'; error: { message: string; name: string } }
  | { kind: 'busy'; retryAfterMs: number }
  | { kind: 'failed'; error: unknown; retryAfterMs: number }
  | { kind: 'unavailable'; error: unknown; retryAfterMs: number }
  | { kind: 'mismatch' }

/** Options of {@link createInbox}. */
export interface InboxOptions<Tx = pg.PoolClient> {
  /**
   * The engine whose table records consumed messages (`createEngine`; a dedicated table keeps volumes apart). Give
   * it `reservation: 'lock'`: a message then belongs to a delivery only while its transaction lives, so when the
   * consumer's process dies the redelivery is applied at once; under `'row'` it answers `busy` until the dead
   * delivery's lease (`leaseMs`) runs out.
   */
  engine: Engine<Tx>
  /** This consumer's name: the record's scope, so two consumers of one topic each process every message once. */
  consumer: string
  /**
   * How long a consumed message id is remembered. Must exceed the broker's redelivery horizon (JetStream
   * `max_deliver` × backoff, a partner's webhook retry schedule), or a very late redelivery runs again.
   * @default 604_800_000 (7 days)
   */
  retentionMs?: number
  /**
   * Under the engine's `reservation: 'row'`: how long a delivery owns a message before a redelivery may take it over
   * (above the handler's p99; a redelivery after a crash waits this long). Not used by deliveries under `'lock'`.
   * @default the engine's
   */
  leaseMs?: number
  /**
   * Which handler errors are permanent (stored and answered `rejected` on every redelivery) rather than retryable.
   * @default () => 'retryable'
   */
  classify?: (error: unknown) => ErrorClass
  /** Delay advised when a handler failed retryably. @default 1_000 */
  failureRetryAfterMs?: number
  /**
   * Receives what needs attention. Must not throw. When omitted, each event is written as one line to
   * `console.error`, so a message that was not applied is never silent; pass your logger here instead.
   * @default (event) => console.error(describeInboxEvent(event))
   * @example
   * createInbox({ engine, consumer: 'billing', onEvent: (event) => logger.error(event, describeInboxEvent(event)) })
   */
  onEvent?: (event: InboxEvent) => void
}

/**
 * What an inbox reports. `mismatch`: the message id was consumed before with another payload, so this delivery was
 * not applied. A producer reused an id, or a payload changed in transit: an operator decides which payload is right.
 */
export type InboxEvent = {
  type: 'mismatch'
  consumer: string
  topic: string
  messageId: string
  /** The delivery's `tenant`, when it gave one. */
  tenant?: string
}

/**
 * The key record of one message: scope = consumer, operation = topic, key = message id; or, for a delivery that names
 * its tenant, scope = tenant and operation = the consumer and topic (as a JSON array, so no two pairs read alike).
 */
function recordOf(consumer: string, topic: string, messageId: string, tenant: string | undefined) {
  return tenant === undefined
    ? { scope: consumer, operation: topic, key: messageId }
    : { scope: tenant, operation: JSON.stringify([consumer, topic]), key: messageId }
}

/** One line for a log: what happened to which message, and what to do about it. */
export function describeInboxEvent(event: InboxEvent): string {
  const record = recordOf(event.consumer, event.topic, event.messageId, event.tenant)
  return `oncely inbox: message "${event.messageId}" on "${event.topic}" (consumer "${event.consumer}"${event.tenant === undefined ? '' : `, tenant "${event.tenant}"`}) was consumed before with another payload; this delivery was not applied. Check the producer; to apply the new payload, delete the record (scope ${JSON.stringify(record.scope)}, operation ${JSON.stringify(record.operation)}, key ${JSON.stringify(record.key)}) and redeliver.`
}

/** One delivery to consume. */
export interface ConsumeInput<T, Tx = pg.PoolClient> {
  /** The message's unique id: the outbox id / `Nats-Msg-Id`, a provider's event id. */
  messageId: string
  /** The subject or event type. Part of the record's identity. @default 'message' */
  topic?: string
  /**
   * The tenant whose rows the handler changes. Given, the record is the tenant's (its scope), so on a key table
   * distributed by Citus (`distribute()`) it lives on the tenant's node and commits there with the handler's writes,
   * in one single-node transaction; without it every record of the consumer sits on the consumer's node, and a
   * handler writing a tenant's rows elsewhere commits on two nodes. Keep the choice per consumer: one message
   * consumed with and without `tenant` is two records.
   * @default none: the record's scope is the consumer
   * @example inbox.consume({ messageId: event.id, tenant: event.tenantId, payload: event, handler })
   */
  tenant?: string
  /**
   * The message bytes or value. When given, its hash is the record's fingerprint, so the same id with another payload
   * answers `mismatch` instead of silently skipping it. Bytes and strings are hashed exactly as given; any other
   * value as its canonical JSON (RFC 8785), so equal values are one message whatever their member order. Omit it
   * when a producer legitimately varies redeliveries.
   */
  payload?: Uint8Array | ArrayBuffer | string | object
  /** The effect. Its return value (JSON) is stored and returned to duplicates. */
  handler: (ctx: MessageContext<Tx>) => Promise<T>
  /**
   * The message's headers (lower-case names). Only their W3C trace context (`traceparent`, `tracestate`) is read,
   * and only by `@oncely/server/otel`: the consumption then continues the producer's trace. The NATS and webhook
   * adapters pass it for you.
   * @default none
   * @example { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' }
   */
  headers?: Readonly<Record<string, string>>
}

/** A consumer-side inbox. Create with {@link createInbox}. */
export interface Inbox<Tx = pg.PoolClient> {
  /**
   * Runs `handler` at most once per message id (per consumer and topic): the inbox record completes in the handler's
   * transaction, so a redelivery after the commit is a no-op. Ack only after this resolves.
   */
  consume<T = unknown>(input: ConsumeInput<T, Tx>): Promise<ConsumeResult<T>>
}

/**
 * The record's fingerprint of a payload: SHA-256 (hex) of the bytes or string as given, or of the canonical JSON
 * (RFC 8785) of any other value, so two equal values differing only in member order are one message. A structured
 * payload and its canonical JSON text hash alike.
 *
 * @throws {TypeError} naming `payload` when a value cannot be represented exactly in JSON (NaN, an integer beyond
 * 2^53, a bigint, a lone surrogate) or a string holds a lone surrogate: pass the message bytes instead.
 */
export function payloadFingerprint(payload: ConsumeInput<unknown>['payload']): string {
  const hash = createHash('sha256')
  if (payload === undefined) return hash.update('oncely:inbox:any-payload').digest('hex')
  if (typeof payload === 'string') {
    const bytes = Buffer.from(payload, 'utf8')
    // UTF-8 has no lone surrogates: Node writes each as U+FFFD, which would make two different texts one message.
    if (bytes.toString('utf8') !== payload) {
      throw new TypeError(
        'Expected `payload` to be well-formed Unicode text, but it holds a lone surrogate. Pass the message bytes to fingerprint them as received.',
      )
    }
    return hash.update(bytes).digest('hex')
  }
  if (ArrayBuffer.isView(payload)) {
    return hash.update(new Uint8Array(payload.buffer, payload.byteOffset, payload.byteLength)).digest('hex')
  }
  if (payload instanceof ArrayBuffer) return hash.update(new Uint8Array(payload)).digest('hex')
  let text: string
  try {
    text = canonicalJson(payload)
  } catch (error) {
    throw new TypeError(
      `Expected \`payload\` to be a JSON value: ${(error as Error).message}. Pass the message bytes to fingerprint them as received.`,
      { cause: error },
    )
  }
  return hash.update(text).digest('hex')
}

function parseResult<T>(body: Buffer): T {
  return (body.length === 0 ? undefined : JSON.parse(body.toString('utf8'))) as T
}

/**
 * The inbox pattern on the idempotency engine: scope = consumer, operation = topic, key = message id. The record is
 * reserved, then completed in the same transaction as the handler's effect. A crash before the commit leaves nothing
 * under the engine's `reservation: 'lock'` (recommended here: the redelivery is applied at once), and under `'row'`
 * a lease that a redelivery takes over once it runs out.
 *
 * @example
 * const inbox = createInbox({ engine, consumer: 'billing' })
 * const order = { id: 'o1', amount: 1250 }
 * const result = await inbox.consume({ messageId: 'm1', topic: 'orders.created', payload: order, handler: async ({ tx }) => {
 *   await tx.query('INSERT INTO invoices (order_id) VALUES ($1)', [order.id])
 * } })
 */
export function createInbox<Tx = pg.PoolClient>(options: InboxOptions<Tx>): Inbox<Tx> {
  objectOptions('createInbox()', options)
  const engine = engineOption('engine', options.engine)
  const consumer = nonEmptyString('consumer', options.consumer)
  const retentionMs = positiveInteger('retentionMs', options.retentionMs ?? 604_800_000)
  const leaseMs = options.leaseMs === undefined ? undefined : positiveInteger('leaseMs', options.leaseMs)
  const failureRetryAfterMs = positiveInteger('failureRetryAfterMs', options.failureRetryAfterMs ?? 1_000)
  const classify = optionalFunction('classify', options.classify) ?? (() => 'retryable' as const)
  const onEvent =
    optionalFunction('onEvent', options.onEvent) ??
    ((event: InboxEvent) => console.error(describeInboxEvent(event)))
  const report = (event: InboxEvent) => {
    try {
      onEvent(event)
    } catch {
      // An observer must not change what the broker is told.
    }
  }

  async function consume<T>(input: ConsumeInput<T, Tx>): Promise<ConsumeResult<T>> {
    nonEmptyString('messageId', input?.messageId)
    requiredFunction('handler', input.handler)
    const topic = input.topic ?? 'message'
    const { tenant } = input
    if (tenant !== undefined) nonEmptyString('tenant', tenant)
    const execution: ExecuteInput<Tx> & MarkedInput = {
      ...recordOf(consumer, topic, input.messageId, tenant),
      fingerprint: payloadFingerprint(input.payload),
      retentionMs,
      ...(leaseMs === undefined ? {} : { leaseMs }),
      classify,
      renderError: (error) => ({
        status: 422,
        body: {
          name: error instanceof Error ? error.name : 'Error',
          message: error instanceof Error ? error.message : String(error),
        },
      }),
      handler: async (ctx) => {
        const result = await input.handler({
          tx: ctx.tx,
          messageId: input.messageId,
          topic,
          attempt: ctx.attempt,
          stepKey: ctx.stepKey,
          signal: ctx.signal,
        })
        return { status: 200, body: result === undefined ? null : JSON.stringify(result) }
      },
      // For telemetry only (the engine ignores it): which message this execution consumes.
      [INBOX_DELIVERY]: { consumer, topic, messageId: input.messageId, headers: input.headers },
    }
    const outcome: Outcome = await engine.execute(execution)
    const result = toResult<T>(outcome, failureRetryAfterMs)
    if (result.kind === 'mismatch') {
      report({
        type: 'mismatch',
        consumer,
        topic,
        messageId: input.messageId,
        ...(tenant === undefined ? {} : { tenant }),
      })
    }
    return result
  }

  return { consume }
}

/** Maps an engine outcome to what a message consumer tells its broker. */
export function toResult<T>(outcome: Outcome, failureRetryAfterMs: number): ConsumeResult<T> {
  switch (outcome.kind) {
    case 'executed':
    case 'replayed': {
      const { response } = outcome
      if (response.status >= 400) return { kind: 'rejected', error: parseResult(response.body) }
      const result = parseResult<T>(response.body)
      return outcome.kind === 'executed' ? { kind: 'processed', result } : { kind: 'duplicate', result }
    }
    case 'in_progress':
      return { kind: 'busy', retryAfterMs: outcome.retryAfterMs }
    case 'mismatch':
      return { kind: 'mismatch' }
    case 'unavailable':
      return { kind: 'unavailable', error: outcome.error, retryAfterMs: outcome.retryAfterMs }
    case 'lease_expired':
      return { kind: 'failed', error: 'lease_expired', retryAfterMs: outcome.retryAfterMs }
    case 'retryable_failure':
      return { kind: 'failed', error: outcome.error ?? outcome.reason, retryAfterMs: failureRetryAfterMs }
  }
}
