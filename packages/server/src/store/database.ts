// The database seam: everything the engine and the layers need from a database library, as a few methods. A
// datasource (src/datasources) implements it once per library (node-postgres, postgres.js, Drizzle, ...); the SQL
// and every rule about it stay in store/, written once against this interface.

/** One statement as oncely sends it: parameterised text (`$1`, `$2`...) and its values. */
export interface Statement {
  /**
   * Set on the statements of every request: a datasource that can keep a statement prepared per connection does so
   * under this name (unique per text), instead of planning it on every request.
   */
  readonly name?: string
  readonly text: string
  readonly values: readonly unknown[]
  /**
   * The SQL type of each parameter (`text`, `integer`, `float8`, `uuid`, `jsonb`, `bytea`), for a datasource that
   * prepares statements at the SQL level and sends several of them in one message. Given with `name`.
   */
  readonly types?: readonly string[]
}

/** What a statement answered: its rows (none for a write without RETURNING) and how many rows it touched. */
export interface Rows<R = Record<string, unknown>> {
  rows: R[]
  rowCount: number
}

/** One step of what a session sends: a statement, or the start or end of its transaction. */
export type Step = Statement | 'BEGIN' | 'COMMIT' | 'ROLLBACK'

/**
 * A connection a caller works on, from `Database.session()`. Its transaction is opened and ended by the steps it
 * runs; the library's own transaction object (`tx`) is what a handler writes through, in that same transaction.
 */
export interface Session<Tx> {
  /**
   * Runs the steps in order and resolves with one `Rows` per step (empty for `BEGIN` and the like). Stops at the
   * first step that fails and rejects with its error; a transaction the steps began is then still open (aborted)
   * until a `ROLLBACK`. A datasource may send all the steps in one message (one round trip). Statements before the
   * first `BEGIN`, or after the transaction ended, run on their own (autocommit).
   */
  run(steps: readonly Step[]): Promise<Rows[]>
  /** The library's transaction object on this session's open transaction: valid from a `BEGIN` to its end. */
  readonly tx: Tx
  /** Called once with the first error when the connection under the session breaks while the session has it. */
  onBroken(listener: (error: Error) => void): void
  /** Gives the connection back, destroyed rather than reused when `error` is given. The session is done after. */
  release(error?: Error): void
}

/**
 * A database library as oncely uses it: sessions for the engine's attempts, statements on their own, statements in
 * a transaction of the caller's, and transactions of the layers' own. Every error a method rejects with carries
 * Postgres's SQLSTATE as `code` (and its message), whatever the library's own error type.
 */
export interface Database<Tx = unknown> {
  /** The library's name, for messages (`'node-postgres'`, `'postgres.js'`, ...). */
  readonly library: string
  /**
   * What the datasource sends through (the pool, the client instance): two datasources with one source share
   * connections, which `steps()` must not (it would wait for a connection the engine's attempt holds).
   */
  readonly source: object
  /** A session for one attempt. A datasource that holds connections takes one of its pool here. */
  session(): Promise<Session<Tx>>
  /** Runs one statement on its own (autocommit), on a connection of the pool. */
  query<R = Record<string, unknown>>(statement: Statement): Promise<Rows<R>>
  /**
   * Runs one statement on its own on the side lane: connections of the datasource's own, for what must commit
   * while an attempt holds a connection of the pool (a recovery point, a renewed lease). A statement there never
   * waits for a connection of the pool, which every attempt in flight may hold.
   */
  side<R = Record<string, unknown>>(statement: Statement): Promise<Rows<R>>
  /** Runs one statement in a transaction of the caller's, given as the library's own transaction object. */
  execute<R = Record<string, unknown>>(tx: Tx, statement: Statement): Promise<Rows<R>>
  /** Runs `work` in a transaction of its own on one connection: commits when it resolves, rolls back when it throws. */
  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T>
  /**
   * Runs `work` in a savepoint of the caller's transaction, by the library's own means: rolled back to the savepoint
   * when it throws, the transaction going on. For a library that would otherwise roll back a whole transaction in
   * which any statement failed (postgres.js); without it, `SAVEPOINT` statements are sent through `execute`.
   */
  savepoint?<T>(tx: Tx, work: (tx: Tx) => Promise<T>): Promise<T>
  /**
   * True for a datasource of a single connection (PGlite): its transactions run one at a time, each waiting for the
   * one before it, so while one is open no other statement reaches the database. The engine then neither renews a
   * lease nor arms the lease guard while an attempt's transaction is open (no other attempt can reach the key
   * meanwhile), and `side` refuses while a transaction is open (nothing commits on its own beside it).
   * @default false
   */
  readonly oneConnection?: boolean
  /**
   * Whether `tx` is one of this library's transaction objects (a cheap shape check), so a layer handed something
   * else says so at once instead of failing in a statement.
   */
  isTransaction(tx: unknown): tx is Tx
  /**
   * Subscribes to losses of idle connections of the pool (a restart, a failover): the engine's replay cache empties
   * on them. A datasource whose library does not report them never calls `listener`.
   */
  onConnectionLost(listener: (error: Error) => void): void
  /**
   * Explains an error of this library's (a missing prepared statement behind a transaction-mode pooler, for
   * example) and adapts to it: returns the error to report instead, and whether the datasource changed how it sends
   * statements so that the same request may at once be tried again; or `undefined`.
   */
  diagnose?(error: unknown): { error: Error; adapted: boolean } | undefined
}

/** A statement that is not one of the transaction's control words. */
export const isStatement = (step: Step): step is Statement => typeof step !== 'string'

/** The first row of a statement's answer, as the row type its statement returns (undefined when there is none). */
export const firstRow = <R>(answer: Rows | undefined): R | undefined =>
  answer?.rows[0] as unknown as R | undefined
