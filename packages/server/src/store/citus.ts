// The supported Citus layout: the key table and the outbox distributed by tenant (their `scope` column) in the
// co-location group of the tenant's business tables, so a request's key record, outbox rows and business rows are on
// one node and commit there in one single-node transaction. The migration ledger stays a plain table on the
// coordinator: only migrate() reads it, in the transaction that runs the DDL there.
import type pg from 'pg'
import { objectOptions, optionalBoolean, positiveInteger } from '../options/check.js'
import { asDatabase } from './as-database.js'
import type { Database, Rows } from './database.js'
import { checkIdentifier, quoteIdent, tableNames } from './identifiers.js'
import { DEFAULT_SCHEMA, DEFAULT_TABLE } from './migrations.js'

/** Options of {@link distribute}. */
export interface DistributeOptions {
  /** The schema `migrate()` created the key table and the outbox in. @default 'oncely' */
  schema?: string
  /** The key table. @default 'idempotency_keys' */
  table?: string
  /**
   * A business table already distributed by the tenant (`create_distributed_table('payments', 'tenant_id')`), whose
   * distribution column holds exactly the values the engine gets as `scope`, with the same type (`text`): the key
   * table and the outbox join its co-location group, so a tenant's shard of each lives on the same node. Without it,
   * the key table starts a group of its own, which business tables then join (`colocate_with =>
   * 'oncely.idempotency_keys'`).
   * @default none
   * @example 'public.payments'
   */
  colocateWith?: string
  /**
   * Shards of the key table's own group; only without `colocateWith` (a group's tables share its shard count).
   * @default the cluster's `citus.shard_count` (32 unless set)
   */
  shardCount?: number
  /**
   * Distribute the outbox (`<schema>.outbox`) too, next to the key table. Its dispatcher then claims tenant by tenant.
   * @default true
   */
  outbox?: boolean
}

/** What {@link distribute} did. */
export interface DistributeResult {
  /** The tables this call distributed, qualified; tables that already were are left as they are. */
  distributed: string[]
  /** The key table's co-location group (`pg_dist_partition.colocationid`). */
  colocationId: number
}

/**
 * Distributes oncely's tables on a Citus cluster (run on the coordinator, after `migrate()`, through a pg.Pool or a
 * datasource): the key table by `scope` in the co-location group of `colocateWith`, and the outbox with it. The
 * engine's statements on the key table all name one scope, so each request's reservation, completion and business
 * writes run on the one node holding the tenant's shard. Idempotent and safe to call from every instance at start-up (they take turns).
 *
 * Then give every engine the tenant as `scope` (the Fastify plugin's `tenant`), the same text as the business tables'
 * distribution column, and `scope` to `enqueue()`; otherwise a request writes two nodes and Citus commits it with
 * two-phase commit.
 *
 * @example
 * await migrate(pool)
 * await pool.query("SELECT create_distributed_table('payments', 'tenant_id')")
 * await distribute(pool, { colocateWith: 'payments' })
 */
export async function distribute(
  on: pg.Pool | Database,
  options: DistributeOptions = {},
): Promise<DistributeResult> {
  const database = asDatabase(on, 'distribute()')
  objectOptions('distribute()', options)
  const schema = checkIdentifier('schema', options.schema ?? DEFAULT_SCHEMA)
  const table = checkIdentifier('table', options.table ?? DEFAULT_TABLE)
  const { colocateWith } = options
  if (colocateWith !== undefined && (typeof colocateWith !== 'string' || colocateWith === '')) {
    throw new TypeError('Expected `colocateWith` to be a table name.')
  }
  const shardCount =
    options.shardCount === undefined ? undefined : positiveInteger('shardCount', options.shardCount)
  if (shardCount !== undefined && colocateWith !== undefined) {
    throw new TypeError(
      'Expected `shardCount` or `colocateWith`, not both: a co-location group has one shard count.',
    )
  }
  const withOutbox = optionalBoolean('outbox', options.outbox, true)

  const keys = tableNames(schema, table).qualified
  const outbox = `${quoteIdent(schema)}.outbox`
  return database.transaction(async (tx) => {
    const client: Run = (text, values = []) => database.execute(tx, { text, values })
    await client('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`oncely:distribute:${keys}`])
    const citus = await client(`SELECT 1 FROM pg_extension WHERE extname = 'citus'`)
    if (citus.rowCount === 0) {
      throw new Error(
        'distribute() needs the citus extension in this database: run it on the coordinator of a Citus cluster, after CREATE EXTENSION citus.',
      )
    }
    const migrated = await client<{ keys: boolean; scoped: boolean }>(
      `SELECT to_regclass($1) IS NOT NULL AS keys,
        EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($2) AND attname = 'scope' AND NOT attisdropped) AS scoped`,
      [keys, outbox],
    )
    if (!migrated.rows[0]?.keys || (withOutbox && !migrated.rows[0].scoped)) {
      throw new Error(
        `distribute() found ${keys} missing or older than this version of @oncely/server: run \`await migrate(pool${schema === DEFAULT_SCHEMA && table === DEFAULT_TABLE ? '' : `, { schema: ${JSON.stringify(schema)}, table: ${JSON.stringify(table)} }`})\` first.`,
      )
    }
    if (colocateWith !== undefined) await checkColocateWith(client, colocateWith)

    const distributed: string[] = []
    const group = colocateWith ?? 'default'
    if (await distributeOne(client, keys, group, shardCount)) distributed.push(keys)
    if (withOutbox && (await distributeOne(client, outbox, keys, undefined))) distributed.push(outbox)
    const { rows } = await client<{ colocationid: number }>(
      'SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = $1::regclass',
      [keys],
    )
    if (colocateWith !== undefined) await checkGroup(client, keys, colocateWith)
    if (withOutbox) await checkGroup(client, outbox, keys)
    return { distributed, colocationId: rows[0]!.colocationid }
  })
}

/** One statement in distribute()'s transaction. */
type Run = <R = Record<string, unknown>>(text: string, values?: unknown[]) => Promise<Rows<R>>

/** Distributes `table` by scope unless it already is; true when it did. Refuses a table distributed otherwise. */
async function distributeOne(
  client: Run,
  table: string,
  colocateWith: string,
  shardCount: number | undefined,
): Promise<boolean> {
  const { rows } = await client<{ method: string; column: string | null }>(
    `SELECT partmethod AS method, column_to_column_name(logicalrelid, partkey) AS column
     FROM pg_dist_partition WHERE logicalrelid = $1::regclass`,
    [table],
  )
  const existing = rows[0]
  if (existing) {
    if (existing.method === 'h' && existing.column === 'scope') return false
    throw new Error(
      `${table} is already a Citus table, but not distributed by scope (method ${existing.method}, column ${existing.column ?? 'none'}): undo it with undistribute_table('${table}') and call distribute() again.`,
    )
  }
  const args = ['$1', "'scope'", 'colocate_with => $2']
  const values: unknown[] = [table, colocateWith]
  if (shardCount !== undefined) {
    args.push('shard_count => $3')
    values.push(shardCount)
  }
  await client(`SELECT create_distributed_table(${args.join(', ')})`, values)
  // Rows written before are copied to the shards; the coordinator's copy is no longer read: free its space.
  await client('SELECT truncate_local_data_after_distributing_table($1)', [table])
  return true
}

/** A business table to co-locate with must be hash-distributed; Citus checks that the column types match. */
async function checkColocateWith(client: Run, table: string): Promise<void> {
  const { rows } = await client<{ method: string }>(
    'SELECT partmethod AS method FROM pg_dist_partition WHERE logicalrelid = to_regclass($1)',
    [table],
  )
  if (rows[0]?.method !== 'h') {
    throw new Error(
      `Expected \`colocateWith\` (${table}) to be a table distributed by the tenant: run SELECT create_distributed_table('${table}', '<tenant column>') first.`,
    )
  }
}

/** Refuses a table that was distributed before, in another co-location group than asked. */
async function checkGroup(client: Run, table: string, other: string): Promise<void> {
  const { rows } = await client<{ same: boolean }>(
    `SELECT (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = $1::regclass)
          = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = to_regclass($2)) AS same`,
    [table, other],
  )
  if (!rows[0]?.same) {
    throw new Error(
      `${table} is distributed by scope, but not co-located with ${other}: a tenant's rows of both would be on different nodes. Run SELECT update_distributed_table_colocation('${table}', colocate_with => '${other}').`,
    )
  }
}
