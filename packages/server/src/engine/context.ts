// The `ctx` a handler receives. A class rather than an object literal: a literal that spreads the key's id and
// defines a getter is built property by property on every request (about 1 us), an instance of a class in one
// step with a shape V8 already knows.
import { STORE_DATABASE } from '../hooks.js'
import type { Database } from '../store/database.js'
import type { Claim, ReservationProtocol } from '../store/reservation.js'
import type { LazyAbort } from './lazy-abort.js'
import { stepKeyFor } from './step-key.js'
import type { ExecutionContext, KeyId } from './types.js'

export class AttemptContext<Tx, C extends Claim<Tx>> implements ExecutionContext<Tx> {
  /** The engine's datasource, for `steps()` to refuse it (see steps/steps.ts). */
  readonly [STORE_DATABASE]: Database<Tx>
  readonly tx: Tx
  readonly scope: string
  readonly operation: string
  readonly key: string
  readonly attempt: number
  readonly recoveryPoint: string | null
  // Own functions rather than methods, so a handler may destructure them (`const { stepKey } = ctx`).
  readonly saveRecoveryPoint: (point: string, tx?: Tx) => Promise<boolean>
  readonly stepKey: (step: string) => string
  readonly #abort: LazyAbort

  constructor(
    database: Database<Tx>,
    protocol: ReservationProtocol<C>,
    claim: C,
    id: KeyId,
    abort: LazyAbort,
  ) {
    this[STORE_DATABASE] = database
    this.tx = claim.session.tx
    this.scope = id.scope
    this.operation = id.operation
    this.key = id.key
    this.attempt = claim.attempt
    this.recoveryPoint = claim.recoveryPoint
    this.saveRecoveryPoint = (point, tx) => protocol.saveRecoveryPoint(claim, point, tx)
    this.stepKey = (step) => stepKeyFor(id.scope, id.operation, id.key, step)
    this.#abort = abort
  }

  /** Created on first read: most handlers never read it. */
  get signal(): AbortSignal {
    return this.#abort.signal
  }
}
