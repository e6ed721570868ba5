// The seam (store/database.ts) for a library that lends a connection only for the span of a transaction callback:
// `db.transaction(async (tx) => { ... })` commits when the callback resolves and rolls back when it throws (Drizzle,
// Kysely, Knex, Prisma, TypeORM, postgres.js). The engine opens and ends transactions step by step instead, so a
// session here starts the library's transaction at its BEGIN and keeps the callback waiting until its COMMIT (the
// callback resolves: the library commits) or ROLLBACK (the callback throws a marker: the library rolls back). Each
// datasource of such a library is this, plus how to run a statement through it.
import type { Database, Rows, Session, Statement, Step } from '../store/database.js'

/** What a datasource of a callback-transaction library provides; {@link callbackDatabase} makes a `Database` of it. */
export interface CallbackLibrary<Tx> {
  /** The library's name, for messages. */
  readonly library: string
  /** What the library sends through (its client or pool instance). */
  readonly source: object
  /** Runs `work` in a transaction of the library's own: commits when it resolves, rolls back when it throws. */
  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T>
  /** Runs a statement in `tx`. Rejects with an error that carries Postgres's SQLSTATE as `code`. */
  execute(tx: Tx, statement: Statement): Promise<Rows>
  /** Runs a statement on its own. Rejects like `execute`. */
  query(statement: Statement): Promise<Rows>
  /**
   * Runs a statement on its own on connections the library's transactions never hold (a second client of the
   * library, of at most a few connections).
   */
  side(statement: Statement): Promise<Rows>
  /** A cheap shape check of the library's transaction objects. */
  isTransaction(tx: unknown): tx is Tx
  /** See `Database.diagnose`: for a library whose own errors hide Postgres's, the error as Postgres reported it. */
  diagnose?(error: unknown): { error: Error; adapted: boolean } | undefined
}

/** What a session's callback throws to make the library roll back (an Error: some libraries accept no other). */
class Rollback extends Error {
  override name = 'OncelyRollback'
  constructor() {
    super('oncely ended this transaction with a rollback')
  }
}

/** Whether `error` is (or wraps, as some libraries do) the session's own rollback. */
const isRollback = (error: unknown, marker: Rollback) =>
  error === marker || (error as { cause?: unknown } | null)?.cause === marker

/**
 * A `Database` over a callback-transaction library.
 *
 * @example
 * export const knexDatabase = ({ knex }) => callbackDatabase({ library: 'knex', source: knex, transaction: (work) => knex.transaction(work), ... })
 */
export function callbackDatabase<Tx>(lib: CallbackLibrary<Tx>): Database<Tx> {
  return {
    library: lib.library,
    source: lib.source,
    session: async () => new CallbackSession(lib),
    query: (statement) => lib.query(statement) as Promise<Rows<never>>,
    side: (statement) => lib.side(statement) as Promise<Rows<never>>,
    execute: (tx, statement) => lib.execute(tx, statement) as Promise<Rows<never>>,
    transaction: (work) => lib.transaction(work),
    isTransaction: (tx): tx is Tx => lib.isTransaction(tx),
    ...(lib.diagnose ? { diagnose: (error: unknown) => lib.diagnose?.(error) } : {}),
    // These libraries do not report the loss of an idle connection; a lost one shows in the next statement.
    onConnectionLost: () => {},
  }
}

/** One attempt's session: the library's transaction, held open from a BEGIN step to its COMMIT or ROLLBACK. */
class CallbackSession<Tx> implements Session<Tx> {
  readonly #lib: CallbackLibrary<Tx>
  #tx: Tx | undefined
  /** Settles the callback: resolve to commit, reject with the session's {@link Rollback} to roll back. */
  #end: { commit(): void; rollback(): void } | undefined
  /** The library's transaction, settled once it committed or rolled back. */
  #done: Promise<void> | undefined
  #marker: Rollback | undefined

  constructor(lib: CallbackLibrary<Tx>) {
    this.#lib = lib
  }

  get tx(): Tx {
    if (this.#tx === undefined)
      throw new Error(`No transaction of ${this.#lib.library} is open on this session.`)
    return this.#tx
  }

  async run(steps: readonly Step[]): Promise<Rows[]> {
    const out: Rows[] = []
    for (const step of steps) {
      if (step === 'BEGIN') await this.#begin()
      else if (step === 'COMMIT') await this.#finish(true)
      else if (step === 'ROLLBACK') await this.#finish(false)
      else out.push(await this.#statement(step))
      if (typeof step === 'string') out.push({ rows: [], rowCount: 0 })
    }
    return out
  }

  #statement(statement: Statement): Promise<Rows> {
    // Outside a transaction the session holds nothing: the statement runs on its own.
    return this.#tx === undefined ? this.#lib.query(statement) : this.#lib.execute(this.#tx, statement)
  }

  async #begin(): Promise<void> {
    if (this.#done) throw new Error('A transaction is already open on this session.')
    let started!: (tx: Tx) => void
    const begun = new Promise<Tx>((resolve) => {
      started = resolve
    })
    const marker = new Rollback()
    this.#marker = marker
    const ended = new Promise<void>((commit, reject) => {
      this.#end = { commit: () => commit(), rollback: () => reject(marker) }
    })
    const done = this.#lib.transaction(async (tx) => {
      started(tx)
      await ended
    })
    this.#done = done
    // The library may fail to begin (no connection, a dead server) before it ever calls back.
    this.#tx = await Promise.race([
      begun,
      done.then(() => Promise.reject(new Error('The transaction ended before it began.'))),
    ])
  }

  async #finish(commit: boolean): Promise<void> {
    const done = this.#done
    if (!done) {
      if (commit) throw new Error('No transaction is open on this session to commit.')
      return
    }
    this.#done = undefined
    this.#tx = undefined
    if (commit) this.#end?.commit()
    else this.#end?.rollback()
    this.#end = undefined
    const marker = this.#marker
    try {
      await done
    } catch (error) {
      if (!marker || !isRollback(error, marker)) throw error
    }
  }

  onBroken(): void {
    // The library does not tell; a broken connection shows in the next statement.
  }

  release(): void {
    // A transaction left open (an abandoned attempt) is rolled back; its outcome concerns nobody any more.
    if (this.#done) void this.#finish(false).catch(() => {})
  }
}
