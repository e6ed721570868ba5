import { createHash } from 'node:crypto'
import type pg from 'pg'
import { positiveInteger } from '../engine/options.js'
import type { Engine, ErrorClass, Outcome } from '../engine/types.js'

/** What a message handler receives. */
export interface MessageContext {
  /** The open transaction in which the inbox record completes too. Do every effect on it; never COMMIT it. */
  tx: pg.PoolClient
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
 * `mismatch` → the id was already used for another payload: a producer bug, dead-letter it.
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
export interface InboxOptions {
  /** The engine whose table records consumed messages (`createEngine`; a dedicated table keeps volumes apart). */
  engine: Engine
  /** This consumer's name: the record's scope, so two consumers of one topic each process every message once. */
  consumer: string
  /**
   * How long a consumed message id is remembered. Must exceed the broker's redelivery horizon (JetStream
   * `max_deliver` × backoff, a partner's webhook retry schedule), or a very late redelivery runs again.
   * @default 604_800_000 (7 days)
   */
  retentionMs?: number
  /** How long a delivery owns a message before a redelivery may take it over. Above the handler's p99. @default the engine's */
  leaseMs?: number
  /**
   * Which handler errors are permanent (stored and answered `rejected` on every redelivery) rather than retryable.
   * @default () => 'retryable'
   */
  classify?: (error: unknown) => ErrorClass
  /** Delay advised when a handler failed retryably. @default 1_000 */
  failureRetryAfterMs?: number
}

/** One delivery to consume. */
export interface ConsumeInput<T> {
  /** The message's unique id: the outbox id / `Nats-Msg-Id`, a provider's event id. */
  messageId: string
  /** The subject or event type. Part of the record's identity. @default 'message' */
  topic?: string
  /**
   * The message bytes or value. When given, its hash is the record's fingerprint, so the same id with another payload
   * answers `mismatch` instead of silently skipping it. Omit it when a producer legitimately varies redeliveries.
   */
  payload?: Uint8Array | string | object
  /** The effect. Its return value (JSON) is stored and returned to duplicates. */
  handler: (ctx: MessageContext) => Promise<T>
}

/** A consumer-side inbox. Create with {@link createInbox}. */
export interface Inbox {
  /**
   * Runs `handler` at most once per message id (per consumer and topic): the inbox record completes in the handler's
   * transaction, so a redelivery after the commit is a no-op. Ack only after this resolves.
   */
  consume<T = unknown>(input: ConsumeInput<T>): Promise<ConsumeResult<T>>
}

function fingerprintOf(payload: ConsumeInput<unknown>['payload']): string {
  const hash = createHash('sha256')
  if (payload === undefined) return hash.update('oncely:inbox:any-payload').digest('hex')
  if (typeof payload === 'string' || payload instanceof Uint8Array) return hash.update(payload).digest('hex')
  return hash.update(JSON.stringify(payload)).digest('hex')
}

function parseResult<T>(body: Buffer): T {
  return (body.length === 0 ? undefined : JSON.parse(body.toString('utf8'))) as T
}

/**
 * The inbox pattern on the idempotency engine: scope = consumer, operation = topic, key = message id. The record is
 * reserved, then completed in the same transaction as the handler's effect; a crash before commit leaves nothing but
 * a lease that a redelivery takes over.
 *
 * @example
 * const inbox = createInbox({ engine, consumer: 'billing' })
 * const result = await inbox.consume({ messageId, topic: 'orders.created', payload: data, handler: async ({ tx }) => {
 *   await tx.query('INSERT INTO invoices (order_id) VALUES ($1)', [order.id])
 * } })
 */
export function createInbox(options: InboxOptions): Inbox {
  if (typeof options !== 'object' || options === null)
    throw new TypeError('Expected `options` to be an object.')
  const { engine, consumer } = options
  if (typeof engine?.execute !== 'function') throw new TypeError('Expected `engine` to be an Engine.')
  if (typeof consumer !== 'string' || consumer === '') {
    throw new TypeError('Expected `consumer` to be a non-empty string.')
  }
  const retentionMs = positiveInteger('retentionMs', options.retentionMs ?? 604_800_000)
  const leaseMs = options.leaseMs === undefined ? undefined : positiveInteger('leaseMs', options.leaseMs)
  const failureRetryAfterMs = positiveInteger('failureRetryAfterMs', options.failureRetryAfterMs ?? 1_000)
  const classify = options.classify ?? (() => 'retryable' as const)
  if (typeof classify !== 'function') throw new TypeError('Expected `classify` to be a function.')

  async function consume<T>(input: ConsumeInput<T>): Promise<ConsumeResult<T>> {
    if (typeof input?.messageId !== 'string' || input.messageId === '') {
      throw new TypeError('Expected `messageId` to be a non-empty string.')
    }
    if (typeof input.handler !== 'function') throw new TypeError('Expected `handler` to be a function.')
    const topic = input.topic ?? 'message'
    const outcome: Outcome = await engine.execute({
      scope: consumer,
      operation: topic,
      key: input.messageId,
      fingerprint: fingerprintOf(input.payload),
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
    })
    return toResult<T>(outcome, failureRetryAfterMs)
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
    case 'retryable_failure':
      return { kind: 'failed', error: outcome.error ?? outcome.reason, retryAfterMs: failureRetryAfterMs }
  }
}
