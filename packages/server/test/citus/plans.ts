// Reading Citus' EXPLAIN (FORMAT JSON): where each task of a distributed plan runs and which shards it reads, so a
// test can tell a router plan (one task, on the node holding the key's shard) from anything else.
import pg from 'pg'

/** One task of a distributed plan: the node it runs on and the tables (shards) its remote plan names. */
export interface PlanTask {
  /** `host:port`. */
  node: string
  relations: string[]
}

/** The shape of a distributed plan. */
export interface PlanShape {
  /** False when Citus did not plan the statement at all (no distributed table in it). */
  distributed: boolean
  /** Subplans Citus planned first and whose results the main job reads (0 for a router plan). */
  subplans: number
  /** Every task of every job, subplans first. */
  tasks: PlanTask[]
}

type Json = Record<string, unknown>

function relationsOf(node: unknown, into: string[]): void {
  if (Array.isArray(node)) for (const item of node) relationsOf(item, into)
  else if (node && typeof node === 'object') {
    for (const [name, value] of Object.entries(node as Json)) {
      if (name === 'Relation Name' && typeof value === 'string') into.push(value)
      else relationsOf(value, into)
    }
  }
}

function collect(plan: Json, shape: PlanShape): void {
  const query = plan['Distributed Query'] as Json | undefined
  if (plan['Custom Plan Provider'] === 'Citus Adaptive' && query) {
    shape.distributed = true
    for (const sub of (query.Subplans as Json[] | undefined) ?? []) {
      shape.subplans++
      for (const stmt of (sub.PlannedStmt as Json[] | undefined) ?? []) collect(stmt.Plan as Json, shape)
    }
    const job = query.Job as Json | undefined
    for (const task of (job?.Tasks as Json[] | undefined) ?? []) {
      const [, host, port] = /host=(\S+) port=(\d+)/.exec(String(task.Node)) ?? []
      const relations: string[] = []
      relationsOf(task['Remote Plan'], relations)
      shape.tasks.push({ node: `${host}:${port}`, relations })
    }
    return
  }
  for (const child of (plan.Plans as Json[] | undefined) ?? []) collect(child, shape)
}

/** The shape of the plan of `statement` (an `EXPLAIN`-able statement) on `client`. */
export async function planOf(
  client: pg.ClientBase,
  statement: string,
  values?: unknown[],
): Promise<PlanShape> {
  const { rows } = await client.query(`EXPLAIN (FORMAT JSON) ${statement}`, values)
  const plan = (rows[0]['QUERY PLAN'] as Json[])[0]!.Plan as Json
  const shape: PlanShape = { distributed: false, subplans: 0, tasks: [] }
  collect(plan, shape)
  return shape
}

/** The shard of `table` holding `value`'s rows: its table's name (unqualified) and its node (`host:port`). */
export async function shardOf(
  pool: pg.Pool,
  table: string,
  value: string,
): Promise<{ shard: string; node: string }> {
  const { rows } = await pool.query<{ shard: string; node: string }>(
    `SELECT (parse_ident(shard_name($1::regclass, s.shardid)))[2] AS shard, s.nodename || ':' || s.nodeport AS node
     FROM citus_shards s WHERE s.shardid = get_shard_id_for_distribution_column($1::regclass, $2::text)`,
    [table, value],
  )
  return rows[0]!
}

/** A command the coordinator sent to a node, as Citus logs it (`citus.log_remote_commands`). */
export interface RemoteCommand {
  command: string
  /** `host:port` of the node it went to. */
  node: string
}

/**
 * A pool on `url` whose sessions log every command Citus sends to other nodes, collected into `commands` (cleared by
 * the caller between measurements): what a request costs in coordinator-to-worker round trips and commits, and
 * whether any commit was two-phase (`PREPARE TRANSACTION`).
 */
export function remoteCommandPool(url: string, max = 4): { pool: pg.Pool; commands: RemoteCommand[] } {
  const commands: RemoteCommand[] = []
  const pool = new pg.Pool({ connectionString: url, max, options: '-c citus.log_remote_commands=on' })
  pool.on('error', () => {})
  pool.on('connect', (client: pg.PoolClient) => {
    client.on('notice', (notice: { message?: string; detail?: string }) => {
      const command = /^issuing (.*)$/s.exec(notice.message ?? '')?.[1]
      const node = /on server \S+@(\S+:\d+)/.exec(notice.detail ?? '')?.[1]
      if (command && node) commands.push({ command, node })
    })
  })
  return { pool, commands }
}
