// What reaches every row of a table distributed by Citus (the key table, the outbox): maintenance statements, which
// sweep every tenant. Citus refuses `FOR UPDATE` in a statement over several shards, and a `ctid` names a row only
// within one shard, so on a distributed table such a statement runs on each shard by itself (Citus'
// run_command_on_shards: each shard's statement in its own transaction on the node holding it, all at once), with
// its batches and SKIP LOCKED intact. On a table that is not distributed, nothing changes.
import type { Database } from './database.js'
import type { ResolvedStore } from './postgres-store.js'
import * as q from './queries.js'

// Databases without Citus (by their datasource's source): asked once, never again (the extension is not created
// under a running engine).
const withoutCitus = new WeakSet<object>()
// Tables found distributed, per source. A table not distributed yet is asked again next time (distribute() may run
// after the engine started); a distributed one stays so.
const distributedOn = new WeakMap<object, Set<string>>()

/** Whether `table` (a quoted, qualified name) is a table Citus distributes by hash, through `database`. */
export async function isDistributed(database: Database, table: string): Promise<boolean> {
  const { source } = database
  if (withoutCitus.has(source)) return false
  if (distributedOn.get(source)?.has(table)) return true
  const citus = await database.query<{ present: boolean }>({
    text: `SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL AS present`,
    values: [],
  })
  if (!citus.rows[0]?.present) {
    withoutCitus.add(source)
    return false
  }
  const { rows } = await database.query<{ distributed: boolean }>({
    text: `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1) AND partmethod = 'h')
       AS distributed`,
    values: [table],
  })
  if (!rows[0]?.distributed) return false
  let tables = distributedOn.get(source)
  if (!tables) {
    tables = new Set()
    distributedOn.set(source, tables)
  }
  tables.add(table)
  return true
}

/** The marker for the shard's table name in a statement given to {@link onEveryShard}. */
export const SHARD = '%1$s'

/**
 * Runs `statement` once on every shard of the distributed `table`, with {@link SHARD} standing for the shard's table,
 * and returns each shard's result: the value of a query's first row and column, or a command's tag (`DELETE 3`).
 * Rejects with the first shard's error when any failed (the others' statements committed).
 */
export async function onEveryShard(database: Database, table: string, statement: string): Promise<string[]> {
  // run_command_on_shards fills the template with format(): a literal % is %%.
  const template = statement.replaceAll('%', '%%').replaceAll('%%1$s', SHARD)
  const { rows } = await database.query<{ shardid: string; success: boolean; result: string }>({
    text: 'SELECT shardid, success, result FROM run_command_on_shards($1::regclass, $2)',
    values: [table, template],
  })
  const failed = rows.find((row) => !row.success)
  if (failed) throw new Error(`On shard ${failed.shardid} of ${table}: ${failed.result}`)
  return rows.map((row) => row.result)
}

/** The rows a command's tag says it affected (`DELETE 3` → 3). */
export const affected = (tag: string) => Number(/(\d+)$/.exec(tag)?.[1] ?? 0)

/**
 * One batch of the reaper: the engine's statement, deleting up to `batchSize` expired key records; on a distributed
 * key table, that statement on every shard at once (up to `batchSize` per shard). Returns how many it deleted.
 */
export async function reapBatch(store: ResolvedStore, batchSize: number): Promise<number> {
  const { database, names } = store
  if (!(await isDistributed(database, names.qualified))) {
    return (await database.query(q.reap(names, batchSize))).rowCount
  }
  const tags = await onEveryShard(database, names.qualified, q.reapText(SHARD, String(batchSize)))
  return tags.reduce((sum, tag) => sum + affected(tag), 0)
}
