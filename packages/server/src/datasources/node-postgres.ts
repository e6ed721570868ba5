// The node-postgres datasource: the seam (store/database.ts) over a `pg.Pool`. The handler's transaction is the
// `pg.PoolClient` the session holds. Several steps travel in one message (see pg-message.ts): the reservation with
// its BEGIN, the finished record with its COMMIT, so a new key costs the round trips of the bare transaction.
import type pg from 'pg'
import { StoreSetupError } from '../errors.js'
import { hasMethods, objectOptions, optionalBoolean } from '../options/check.js'
import type { Database, Rows, Session, Statement, Step } from '../store/database.js'
import { sideLane } from '../store/side-lane.js'
import { executeText, fitsOneMessage, inlineText, sqlPrepared, sqlPreparedName } from './pg-message.js'

/** Options of {@link nodePostgres}. */
export interface NodePostgresOptions {
  /**
   * Your pool, on the database that holds your business tables too. oncely adds an `'error'` listener to it (an
   * idle client losing its connection must not crash the process) and never ends it.
   */
  pool: pg.Pool
  /**
   * Prepare the engine's statements once per connection (no planning per request). Set `false` behind a pooler in
   * transaction mode (PgBouncer, RDS Proxy...), where the next statement may reach another server connection that
   * never saw the `PREPARE`: every statement is then planned where it runs.
   * @default true
   * @example
   * nodePostgres({ pool: pgbouncerPool, preparedStatements: false })
   */
  preparedStatements?: boolean
}

// Which SQL-level prepared statements each connection holds (module-wide: engines on one table share a name).
const preparedOn = new WeakMap<pg.ClientBase, Set<string>>()
// Pools found to reach Postgres through a pooler in transaction mode: nothing is prepared on them from then on.
const pooled = new WeakSet<pg.Pool>()
const databases = new WeakMap<pg.Pool, Map<boolean, Database<pg.PoolClient>>>()

/**
 * The node-postgres datasource. One per pool and setting (calling it again returns the same object).
 *
 * @example
 * const store = postgresStore({ database: nodePostgres({ pool }) }) // what postgresStore({ pool }) does
 */
export function nodePostgres(options: NodePostgresOptions): Database<pg.PoolClient> {
  objectOptions('nodePostgres()', options)
  const { pool } = options
  hasMethods('pool', pool, ['connect', 'query'], 'a pg.Pool')
  const preparedStatements = optionalBoolean('preparedStatements', options.preparedStatements, true)
  let known = databases.get(pool)
  if (!known) {
    known = new Map()
    databases.set(pool, known)
  }
  let database = known.get(preparedStatements)
  if (!database) {
    database = createDatabase(pool, preparedStatements)
    known.set(preparedStatements, database)
  }
  return database
}

function createDatabase(pool: pg.Pool, preparedStatements: boolean): Database<pg.PoolClient> {
  guardPool(pool)
  const prepares = () => preparedStatements && !pooled.has(pool)
  /** The statement as node-postgres sends it: named (prepared once per connection) only while that is allowed. */
  const config = (statement: Statement): pg.QueryConfig =>
    statement.name !== undefined && prepares()
      ? { name: statement.name, text: statement.text, values: statement.values as unknown[] }
      : { text: statement.text, values: statement.values as unknown[] }
  const rowsOf = <R = Record<string, unknown>>(result: pg.QueryResult): Rows<R> => ({
    rows: result.rows as R[],
    rowCount: result.rowCount ?? 0,
  })

  async function runOn(client: pg.ClientBase, steps: readonly Step[]): Promise<Rows[]> {
    if (steps.length > 1 && fitsOneMessage(steps)) {
      let message = ''
      for (const step of steps) {
        if (message !== '') message += '; '
        if (typeof step === 'string') message += step
        else if (step.name !== undefined && prepares()) {
          // Checked here rather than in prepare(): a statement the connection already holds costs no await.
          if (!preparedOn.get(client)?.has(sqlPreparedName(step))) await prepare(client, step)
          message += executeText(step)
        } else message += inlineText(step)
      }
      // One result per statement of the message.
      const results = (await client.query(message)) as unknown as pg.QueryResult[]
      for (const result of results) result.rowCount ??= 0
      return results as Rows[]
    }
    const out: Rows[] = []
    for (const step of steps) {
      out.push(rowsOf(await client.query(typeof step === 'string' ? step : config(step))))
    }
    return out
  }

  const database: Database<pg.PoolClient> = {
    library: 'node-postgres',
    source: pool,

    async session(): Promise<Session<pg.PoolClient>> {
      const client = await pool.connect()
      let broken: ((error: Error) => void) | undefined
      const onError = (error: Error) => broken?.(error)
      client.on('error', onError)
      return {
        tx: client,
        run: (steps) => runOn(client, steps),
        onBroken(listener) {
          broken = listener
        },
        release(error) {
          // The listener stays until the pool has its own again: a checked-out client that emits 'error' with no
          // listener crashes the process.
          client.release(error)
          client.off('error', onError)
        },
      }
    },

    query: async (statement) => rowsOf(await pool.query(config(statement))),
    side: async (statement) => rowsOf(await sideLane(pool).query(config(statement))),
    execute: async (tx, statement) => rowsOf(await tx.query(config(statement))),

    async transaction(work) {
      const client = await pool.connect()
      let broken: Error | undefined
      const onError = (error: Error) => {
        broken ??= error
      }
      client.on('error', onError)
      try {
        await client.query('BEGIN')
        const result = await work(client)
        await client.query('COMMIT')
        return result
      } catch (error) {
        await client.query('ROLLBACK').catch((rollbackError: Error) => {
          broken ??= rollbackError
        })
        throw error
      } finally {
        client.release(broken)
        client.off('error', onError)
      }
    },

    isTransaction: (tx): tx is pg.PoolClient =>
      typeof (tx as pg.ClientBase | undefined)?.query === 'function' &&
      typeof (tx as pg.PoolClient).release === 'function',

    onConnectionLost(listener) {
      onPoolError(pool, listener)
    },

    diagnose(error) {
      // What a pooler in transaction mode does to prepared statements: one prepared on a server connection is
      // missing on the next (26000), or already there when another client prepared it (42P05). Neither happens on a
      // connection of one's own. From then on nothing is prepared on this pool, and the error is explained.
      const code = (error as { code?: unknown } | undefined)?.code
      // Requests in flight when another one found out meet it too: each is explained, and may be tried again.
      if ((code !== '26000' && code !== '42P05') || !preparedStatements) return undefined
      pooled.add(pool)
      const message = error instanceof Error ? error.message : String(error)
      const explained = new StoreSetupError(
        `The idempotency store prepares its statements once per connection, but Postgres answered "${message}": its connections go through a pooler in transaction mode (PgBouncer, RDS Proxy...), where a statement prepared on one server connection is unknown to the next. From now on this pool's statements are not prepared; set postgresStore({ pool, preparedStatements: false }) to make that the configuration.`,
        code,
        error,
      )
      return { error: explained, adapted: true }
    },
  }
  return database
}

/**
 * PREPAREs a statement on a connection that does not hold it yet (the caller checks, without an await): on its own,
 * so whether it exists never depends on which statement of a later message failed (a PREPARE is not undone by a
 * rollback).
 */
async function prepare(client: pg.ClientBase, statement: Statement): Promise<void> {
  const { name, prepare: text } = sqlPrepared(statement)
  await client.query(text)
  let prepared = preparedOn.get(client)
  if (!prepared) {
    prepared = new Set()
    preparedOn.set(client, prepared)
  }
  prepared.add(name)
}

// One 'error' listener per pool, fanned out to every engine on it (so many engines do not trip MaxListeners).
const poolErrorListeners = new WeakMap<pg.Pool, Set<(error: Error) => void>>()
function onPoolError(pool: pg.Pool, listener: (error: Error) => void): void {
  let listeners = poolErrorListeners.get(pool)
  if (!listeners) {
    const set = new Set<(error: Error) => void>()
    listeners = set
    poolErrorListeners.set(pool, set)
    pool.on('error', (error) => {
      for (const notify of set) notify(error)
    })
  }
  listeners.add(listener)
}

const guarded = new WeakSet<object>()
const ignore = () => {}

/**
 * Makes sure no client of the pool can crash the process with an unhandled 'error' event. pg-pool leaves a window
 * with no listener at all: it hands a client to `pool.connect()` through a promise, so if the same socket read also
 * carries the server's FATAL "terminating connection" message, 'error' is emitted before the caller's continuation
 * can attach its listener (regression: connection-kill.test.ts). A permanent listener attached on 'acquire', which
 * pg-pool emits synchronously before handing the client out, closes it. The error still reaches whoever is using
 * the client through its failed query.
 */
export function guardPool(pool: pg.Pool): void {
  if (guarded.has(pool)) return
  guarded.add(pool)
  if (pool.listenerCount('error') === 0) pool.on('error', ignore)
  pool.on('acquire', (client) => {
    if (guarded.has(client)) return
    guarded.add(client)
    client.on('error', ignore)
  })
}
