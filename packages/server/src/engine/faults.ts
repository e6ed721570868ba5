import type pg from 'pg'

/** Where fault injection may interrupt an execution. */
export interface EngineHookContext<Tx = pg.PoolClient> {
  scope: string
  operation: string
  key: string
  attempt: number
  /** The business transaction, open, as the datasource's library types it (absent in `afterCommit`). */
  tx?: Tx
}

/**
 * Interruption points for fault injection. A hook that throws simulates a crash at that point: the engine abandons
 * the attempt (the transaction rolls back; under the row protocol the key keeps its lease until it runs out) and
 * `execute` rejects with the error. A hook that awaits simulates a pause.
 */
export interface EngineHooks<Tx = pg.PoolClient> {
  /** After the key was reserved, inside the business transaction (`tx` is set), before the handler runs. */
  afterReserve?: (ctx: EngineHookContext<Tx>) => Promise<void> | void
  /** After the handler returned and the response was checked, before the fenced completion and COMMIT. */
  beforeCommit?: (ctx: EngineHookContext<Tx>) => Promise<void> | void
  /** After COMMIT, before `execute` returns (so before any byte is sent). */
  afterCommit?: (ctx: EngineHookContext<Tx>) => Promise<void> | void
}

/** What only tests and chaos runs may set (see `@oncely/server/testing`). */
export interface FaultOptions<Tx = pg.PoolClient> {
  hooks?: EngineHooks<Tx>
  /**
   * Breaks the guarantees on purpose so a chaos checker can prove it detects duplicates: `disableFencing: true` lets
   * a completion ignore the lock token or row version, so a paused attempt commits after a takeover.
   */
  unsafe?: { disableFencing?: boolean }
}
