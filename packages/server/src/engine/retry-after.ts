// The `Retry-After` of a 409: an estimate of when the attempt holding the key will be done, so a duplicate asks
// again about when the answer exists, neither hammering the store every second through a long request nor waiting
// out a whole lease for one that ends at once.

/** The least a duplicate is told to wait: polling faster only loads the store. */
export const MIN_RETRY_AFTER_MS = 1_000

/** The most a duplicate is told to wait in one go when nothing bounds it better: it asks again then. */
export const MAX_RETRY_AFTER_MS = 30_000

/** Operations whose typical duration is remembered; past it the table starts over (operations are few in practice). */
const MAX_OPERATIONS = 1_000

/** Weight of the newest execution in the moving average of an operation's duration. */
const WEIGHT = 0.2

/** What the store says of the attempt that holds a key. */
export interface Holder {
  /** How long it has run (since it reserved the key, or saved its last recovery point), when known. */
  heldForMs: number | null
  /** How much of its lease is left, when its lease is kept in the key's row. */
  leaseRemainingMs: number | null
}

/** The typical duration of each operation's successful executions in this process (a moving average). */
export class Durations {
  readonly #typical = new Map<string, number>()

  observe(operation: string, durationMs: number): void {
    const typical = this.#typical.get(operation)
    if (typical === undefined && this.#typical.size >= MAX_OPERATIONS) this.#typical.clear()
    this.#typical.set(
      operation,
      typical === undefined ? durationMs : typical + WEIGHT * (durationMs - typical),
    )
  }

  typical(operation: string): number | undefined {
    return this.#typical.get(operation)
  }
}

/**
 * How long a duplicate should wait before asking again: the holder's typical remaining time (its operation's
 * typical duration minus how long it has run), or, for an operation not seen finishing yet, as long again as it has
 * run so far (a request that ran for 4 s is likely to run a while longer; asking at doubling intervals finds its end
 * within twice its duration). Never less than {@link MIN_RETRY_AFTER_MS}, never more than the lease left (after it,
 * the key can be taken over) or {@link MAX_RETRY_AFTER_MS}.
 */
export function estimateRetryAfterMs(holder: Holder, typicalMs: number | undefined): number {
  const ran = Math.max(0, holder.heldForMs ?? 0)
  const remaining = typicalMs !== undefined && typicalMs > ran ? typicalMs - ran : ran
  const ceiling = Math.min(MAX_RETRY_AFTER_MS, holder.leaseRemainingMs ?? MAX_RETRY_AFTER_MS)
  return Math.round(Math.max(MIN_RETRY_AFTER_MS, Math.min(remaining, ceiling)))
}
