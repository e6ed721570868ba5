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
  /** Runs `work` in a savepoint of `tx` by the library's own means (see `Database.savepoint`), when it has them. */
  savepoint?<T>(tx: Tx, work: (tx: Tx) => Promise<T>): Promise<T>
  /**
   * Whether the library pipelines the statements sent on one transaction without waiting for their answers (it
   * writes them together and reads the answers in order): a session then sends the steps of one run together.
   * @default false
   */
  readonly pipelines?: boolean
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
    ...(lib.savepoint ? { savepoint: lib.savepoint.bind(lib) } : {}),
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
  /** Set when the library's transaction ended before the session's COMMIT or ROLLBACK, with why. */
  #ended: { error: unknown } | undefined
  /**
   * Rejects, with why, when the library's transaction ends before the session's COMMIT or ROLLBACK. A statement sent
   * before the session learnt of it is answered by this too: a library may never settle a statement it had queued on
   * a connection that closed (postgres.js 3.4 drops the statements of a transaction that wait behind one in flight),
   * and an attempt waiting on it would never be answered.
   */
  #lost: Promise<never> | undefined

  constructor(lib: CallbackLibrary<Tx>) {
    this.#lib = lib
  }

  get tx(): Tx {
    if (this.#tx === undefined)
      throw new Error(`No transaction of ${this.#lib.library} is open on this session.`)
    return this.#tx
  }

  async run(steps: readonly Step[]): Promise<Rows[]> {
    if (this.#lib.pipelines) return this.#pipelined(steps)
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

  /**
   * The steps of a library that pipelines: in the transaction, each statement is sent without waiting for the one
   * before, and its COMMIT or ROLLBACK right after them, so they share round trips. Once one fails, those after it
   * fail too (the transaction is aborted) and change nothing, and a COMMIT after it rolls back; the answer is the
   * first failure. The library's BEGIN, and statements on their own, still wait: a failed one stops the steps.
   */
  async #pipelined(steps: readonly Step[]): Promise<Rows[]> {
    const sent: Promise<{ rows: Rows } | { error: unknown }>[] = []
    const settle = (answer: Promise<Rows>) =>
      answer.then(
        (rows) => ({ rows }),
        (error: unknown) => ({ error }),
      )
    const empty: Rows = { rows: [], rowCount: 0 }
    for (const step of steps) {
      if (step === 'BEGIN' || this.#tx === undefined) {
        // Nothing is sent while an earlier step may still fail.
        const answers = await Promise.all(sent)
        if (answers.some((answer) => 'error' in answer)) break
        if (step === 'BEGIN') await this.#begin()
        sent.push(settle(step === 'BEGIN' ? Promise.resolve(empty) : this.#step(step)))
      } else sent.push(settle(this.#step(step)))
    }
    const out: Rows[] = []
    for (const answer of await Promise.all(sent)) {
      if ('error' in answer) throw answer.error
      out.push(answer.rows)
    }
    return out
  }

  #step(step: Step): Promise<Rows> {
    const empty: Rows = { rows: [], rowCount: 0 }
    if (step === 'COMMIT') return this.#finish(true).then(() => empty)
    if (step === 'ROLLBACK') return this.#finish(false).then(() => empty)
    if (step === 'BEGIN') return this.#begin().then(() => empty)
    return this.#statement(step)
  }

  #statement(statement: Statement): Promise<Rows> {
    // Outside a transaction the session holds nothing: the statement runs on its own.
    if (this.#tx === undefined) return this.#lib.query(statement)
    // The library ended the transaction on its own (its connection was lost): nothing more is sent through it, as a
    // library may send it on a connection it has opened again since, outside the transaction.
    if (this.#ended) return Promise.reject(this.#ended.error)
    const answer = this.#lib.execute(this.#tx, statement)
    return this.#lost ? Promise.race([answer, this.#lost]) : answer
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
    let lose!: (error: unknown) => void
    const lost = new Promise<never>((_, reject) => {
      lose = reject
    })
    // Only ever raced against a statement: it may reject with none waiting.
    lost.catch(() => {})
    this.#done = done
    this.#ended = undefined
    this.#lost = lost
    done.then(
      () => {},
      (error: unknown) => {
        if (isRollback(error, marker)) return
        lose(error)
        if (this.#done === done) this.#ended = { error }
      },
    )
    // The library may fail to begin (no connection, a dead server) before it ever calls back: then no transaction
    // is open, and the ROLLBACK that follows has nothing to end.
    try {
      this.#tx = await Promise.race([
        begun,
        done.then(() => Promise.reject(new Error('The transaction ended before it began.'))),
      ])
    } catch (error) {
      this.#done = undefined
      this.#end = undefined
      throw error
    }
  }

  async #finish(commit: boolean): Promise<void> {
    const done = this.#done
    if (!done) {
      if (commit) throw new Error('No transaction is open on this session to commit.')
      return
    }
    this.#done = undefined
    this.#tx = undefined
    const lost = this.#ended
    this.#ended = undefined
    // A transaction the library already ended is not settled again (postgres.js would send its ROLLBACK on a
    // connection that is gone): it is over, and why is the answer.
    if (lost) throw lost.error
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
