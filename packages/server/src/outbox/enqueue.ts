import { randomUUID } from 'node:crypto'
import type pg from 'pg'
import type { Database, Statement } from '../store/database.js'
import { outboxNames } from './names.js'
import * as q from './queries.js'

/** A message to publish once the surrounding transaction commits. */
export interface EnqueueInput {
  /** Where it goes: the NATS subject, or a name your publisher maps to a URL. */
  topic: string
  /** Any JSON value. Serialized with `JSON.stringify` (stored as `jsonb`). */
  payload: unknown
  /**
   * Messages with the same aggregate key (an order id, an account id) are published in enqueue order and never two
   * at a time. Omit it for messages whose order does not matter (they are published in parallel).
   */
  aggregateKey?: string
  /**
   * String headers handed to the publisher with the message. To continue the active trace in the consumer, pass
   * the trace context here: `traceHeaders()` from `@oncely/server/otel`.
   * @default {}
   * @example headers: { ...traceHeaders(), 'content-language': 'en' }
   */
  headers?: Record<string, string>
  /** Your own id for the message (a UUID). @default a random UUID */
  id?: string
  /**
   * The tenant the message belongs to: the key record's scope (`ctx.scope` in an engine handler). On a single
   * Postgres it is only recorded. On a distributed outbox (Citus, `distribute()`) it is what places the row on the
   * tenant's node, in the same single-node transaction as the tenant's key record and business rows; without it the
   * row goes to the empty scope's node, and the transaction spans two nodes.
   * @default ''
   * @example enqueue(ctx.tx, { topic: 'payments.created', payload, scope: ctx.scope })
   */
  scope?: string
}

/** Options of {@link enqueue}. */
export interface EnqueueOptions<Tx = pg.ClientBase> {
  /** The schema `migrate()` created the outbox in. @default 'oncely' */
  schema?: string
  /**
   * The datasource `tx` belongs to, when it is not a node-postgres client: the row is then written through that
   * library, in `tx`'s transaction (`ctx.tx` of an engine built on the same datasource).
   * @default none: `tx` is a pg client
   * @example
   * await enqueue(ctx.tx, { topic: 'orders.created', payload: order }, { database: drizzleDatabase({ db }) })
   */
  database?: Database<Tx>
}

/**
 * Writes an outbox row in your open transaction (`ctx.tx` inside an engine handler), so the message exists if and
 * only if the business change commits. Wakes dispatchers with `pg_notify` (delivered at commit). Returns the id.
 *
 * @example
 * await engine.execute({ ...request, handler: async ({ tx }) => {
 *   const order = await createOrder(tx, body)
 *   await enqueue(tx, { topic: 'orders.created', payload: order, aggregateKey: order.id })
 *   return { status: 201, body: order }
 * } })
 */
export async function enqueue<Tx = pg.ClientBase>(
  tx: Tx,
  input: EnqueueInput,
  options: EnqueueOptions<Tx> = {},
): Promise<string> {
  const { database } = options
  let run: (statement: Statement) => Promise<unknown>
  if (database !== undefined) {
    if (!database.isTransaction(tx)) {
      throw new TypeError(
        `Expected \`tx\` to be a transaction of ${database.library} (ctx.tx inside a handler).`,
      )
    }
    run = (statement) => database.execute(tx, statement)
  } else {
    const client = tx as pg.ClientBase
    if (typeof client?.query !== 'function') {
      throw new TypeError(
        'Expected `tx` to be a pg client inside a transaction (for another library, pass its datasource as `database`).',
      )
    }
    run = (statement) => client.query({ text: statement.text, values: [...statement.values] })
  }
  if (typeof input?.topic !== 'string' || input.topic === '') {
    throw new TypeError('Expected `topic` to be a non-empty string.')
  }
  if (
    input.aggregateKey !== undefined &&
    (typeof input.aggregateKey !== 'string' || input.aggregateKey === '')
  ) {
    throw new TypeError('Expected `aggregateKey` to be a non-empty string.')
  }
  if (input.scope !== undefined && typeof input.scope !== 'string') {
    throw new TypeError('Expected `scope` to be a string.')
  }
  for (const [name, value] of Object.entries(input.headers ?? {})) {
    if (typeof value !== 'string') throw new TypeError(`Expected header \`${name}\` to be a string.`)
  }
  const payload = JSON.stringify(input.payload)
  if (payload === undefined) throw new TypeError('Expected `payload` to be a JSON value.')
  const { table, channel } = outboxNames(options.schema)
  const id = input.id ?? randomUUID()
  const aggregateKey = input.aggregateKey ?? null
  if (aggregateKey !== null) await run(q.lockAggregate(table, aggregateKey))
  await run(
    q.insert(table, channel, {
      id,
      scope: input.scope ?? '',
      topic: input.topic,
      aggregateKey,
      payload,
      headers: input.headers ?? {},
    }),
  )
  return id
}
