import { randomUUID } from 'node:crypto'
import { positiveInteger } from '../options/check.js'
import type { Database } from '../store/database.js'
import { affected, isDistributed, onEveryShard, SHARD } from '../store/shards.js'
import type { DispatcherEvent, DispatcherHooks } from './dispatcher.js'
import * as q from './queries.js'
import type { OutboxMessage, Publisher } from './types.js'

/** What a dispatcher's rounds work with: its options, checked at construction. */
export interface Outbox {
  database: Database
  /** The quoted outbox table (outboxNames()). */
  table: string
  publisher: Publisher
  batchSize: number
  leaseMs: number
  maxAttempts: number
  retryDelayMs: (attempt: number) => number
  hooks: DispatcherHooks
  emit: (event: DispatcherEvent) => void
  /**
   * The key of the presence lock the dispatcher's LISTEN connection holds, if it does, read at each claim: claims
   * record it, so that a crashed dispatcher's are taken over at once.
   */
  presence: () => number | undefined
}

function describe(error: unknown): string {
  return (error instanceof Error ? `${error.name}: ${error.message}` : String(error)).slice(0, 2_000)
}

/** Publishes one claimed row and marks it published (or failed, or dead), fenced by the claim token. */
async function deliver(outbox: Outbox, row: q.ClaimRow, token: string): Promise<void> {
  const { database, table, emit } = outbox
  const message: OutboxMessage = {
    id: row.id,
    topic: row.topic,
    payload: row.payload,
    headers: row.headers,
    aggregateKey: row.aggregate_key,
    attempt: row.attempts,
    createdAt: row.created_at,
  }
  try {
    await outbox.publisher.publish(message)
  } catch (error) {
    const delay = Math.max(0, Math.floor(outbox.retryDelayMs(row.attempts)))
    const failed = await database.query<{ status: string }>(
      q.markFailed(table, row, token, describe(error), delay, outbox.maxAttempts),
    )
    const status = failed.rows[0]?.status
    if (status === 'dead') emit({ type: 'dead', id: row.id, topic: row.topic, attempt: row.attempts, error })
    else if (status === 'pending') {
      emit({ type: 'failed', id: row.id, topic: row.topic, attempt: row.attempts, error, retryInMs: delay })
    } else emit({ type: 'lease_lost', id: row.id })
    return
  }
  await outbox.hooks.afterPublish?.(message)
  const marked = await database.query(q.markPublished(table, row, token))
  if (marked.rowCount === 1) emit({ type: 'published', id: row.id, topic: row.topic, attempt: row.attempts })
  else emit({ type: 'lease_lost', id: row.id })
}

/** Buries exhausted rows and claims a batch: in one statement each, or tenant by tenant on a distributed outbox. */
async function claimBatch(outbox: Outbox, token: string): Promise<q.ClaimRow[]> {
  const { database, table, batchSize, leaseMs, maxAttempts } = outbox
  if (!(await isDistributed(database, table))) {
    await database.query(q.buryExhausted(table, maxAttempts))
    return (
      await database.query<q.ClaimRow>(q.claim(table, token, batchSize, leaseMs, outbox.presence() ?? null))
    ).rows
  }
  const tenants = await database.query<{ scope: string }>(q.tenantsDue(table, maxAttempts, batchSize))
  const rows: q.ClaimRow[] = []
  for (const { scope } of tenants.rows) {
    if (rows.length >= batchSize) break
    await database.query(q.buryExhausted(table, maxAttempts, scope))
    const claimed = await database.query<q.ClaimRow>(
      q.claim(table, token, batchSize - rows.length, leaseMs, null, scope),
    )
    rows.push(...claimed.rows)
  }
  return rows
}

/** Claims and publishes one batch; resolves with the number of rows claimed. */
export async function dispatchOnce(outbox: Outbox): Promise<number> {
  const token = randomUUID()
  const rows = await claimBatch(outbox, token)
  rows.sort((a, b) => Number(BigInt(a.seq) - BigInt(b.seq)))
  const results = await Promise.allSettled(rows.map((row) => deliver(outbox, row, token)))
  for (const result of results)
    if (result.status === 'rejected') outbox.emit({ type: 'error', error: result.reason })
  return rows.length
}

/** Deletes published rows older than `olderThanMs` in bounded batches, on every shard of a distributed outbox. */
export async function purgePublished(
  { database, table }: Outbox,
  purge: { olderThanMs?: number; batchSize?: number; maxBatches?: number } = {},
): Promise<number> {
  const olderThanMs = positiveInteger('olderThanMs', purge.olderThanMs ?? 7 * 86_400_000)
  const size = positiveInteger('batchSize', purge.batchSize ?? 1_000)
  const maxBatches = positiveInteger('maxBatches', purge.maxBatches ?? 100)
  let total = 0
  const distributed = await isDistributed(database, table)
  for (let batch = 0; batch < maxBatches; batch++) {
    const deleted = distributed
      ? (await onEveryShard(database, table, q.purgeText(SHARD, String(olderThanMs), String(size)))).reduce(
          (sum, tag) => sum + affected(tag),
          0,
        )
      : ((await database.query(q.purgePublished(table, olderThanMs, size))).rowCount ?? 0)
    total += deleted
    if (deleted < size) break
  }
  return total
}

/** Moves dead-lettered rows back to pending with a fresh attempt budget; returns how many. */
export async function requeueDead({ database, table }: Outbox, ids: readonly string[]): Promise<number> {
  return (await database.query(q.requeueDead(table, ids))).rowCount
}
