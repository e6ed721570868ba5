// What both reservation protocols (row-reservation.ts, lock-reservation.ts) do with the store alike: connect for a
// reservation and give the session back when it fails or claims nothing, arm the lease guard by one rule, tell the
// replay cache which server answered, and send the statements on a key's row that both fence on a lock token.
import type { Database, Session, Statement } from './database.js'
import type { ResolvedStore } from './postgres-store.js'
import * as q from './queries.js'
import type { Exec, ReserveRequest, ServerObserver } from './reservation.js'

export class KeyRecords<Tx> {
  readonly database: Database<Tx>
  /** The statements both protocols send about a key. */
  readonly sql: q.KeyStatements
  /** Told the server each reservation or inspection reached (see ServerObserver). */
  readonly observe: ServerObserver
  readonly #fenced: boolean

  constructor(store: ResolvedStore<Tx>, fenced: boolean, observe: ServerObserver) {
    this.database = store.database
    this.sql = q.keyStatements(store.names)
    this.observe = observe
    this.#fenced = fenced
  }

  /**
   * The business transaction's idle limit, in milliseconds (0 for none). The lease guard is a fence too: the
   * unfenced engine goes without it, and so does one connection, where no other attempt can take the key over while
   * the transaction is open.
   */
  guardMs(request: ReserveRequest): number {
    return this.#fenced && !this.database.oneConnection ? request.leaseMs : 0
  }

  /**
   * Connects and runs the first round trips of a reservation on the new session; when they fail, the session goes
   * back to the pool with the error (so a broken connection is not reused) and the failure rejects the reservation.
   */
  async reserving<T>(first: (session: Session<Tx>) => Promise<T>): Promise<T> {
    const session = await this.database.session()
    try {
      return await first(session)
    } catch (error) {
      session.release(error as Error)
      throw error
    }
  }

  /**
   * Ends the transaction a reservation that claimed nothing began, and gives the session back, without making the
   * answer wait for it.
   */
  endAside(session: Session<Tx>): void {
    void session.run(['ROLLBACK']).then(
      () => session.release(),
      (error) => session.release(error as Error),
    )
  }

  /** Frees a key held by `token` after its business transaction was rolled back, on `on`. */
  async release(request: ReserveRequest, token: string, on: Exec): Promise<void> {
    await on(this.sql.release(request.id, token))
  }

  /** Extends the lease `token` holds in the key's row, on the side lane: false when the key is no longer its. */
  async renew(request: ReserveRequest, token: string): Promise<boolean> {
    return (await this.database.side(this.sql.renew(request.id, token, request.leaseMs))).rowCount === 1
  }

  /**
   * Sends a recovery point's statement: committed at once on the side lane, or on `tx` (the caller's transaction) to
   * commit with it. True when it wrote the key's row, false when fenced out.
   */
  async save(statement: Statement, tx: unknown): Promise<boolean> {
    const saved =
      tx === undefined
        ? await this.database.side(statement)
        : await this.database.execute(tx as Tx, statement)
    return saved.rowCount === 1
  }
}
