import { StorageError } from '../errors/storage-error.js'
import type { StoreEventSink } from '../store.js'

/** Why a renewal could not keep a claim: `reason` is for people, `cause` the error behind it, if any. */
export interface Lapse {
  reason: string
  cause?: unknown
}

/**
 * One tab's or process's claim on one intent while it drives it: how the built-in stores keep "one driver at a
 * time" honest. The claim may be lost while its section runs (a lease renewal failed or came too late, the lock
 * was replaced or stolen, or the owner it rests on was lost): it is then reported once, at once, as a
 * `claim-lost` event, and {@link HeldClaim.run} rejects with the loss once the section settled (the section's own
 * error, if any, wins). The section is not interrupted: another driver may have started meanwhile, and the
 * server's key check keeps the two to one effect.
 */
export class HeldClaim {
  #lost: StorageError | undefined
  #stopRenewal: (() => Promise<void>) | undefined
  #until = Number.POSITIVE_INFINITY

  constructor(
    readonly store: 'file' | 'indexedDb',
    readonly id: string,
    readonly sink: () => StoreEventSink | undefined,
  ) {}

  /** The loss, once the claim can no longer be vouched for. */
  get lost(): StorageError | undefined {
    return this.#lost
  }

  /** Marks the claim lost (once) and reports it. */
  lose(reason: string, cause?: unknown): void {
    if (this.#lost) return
    this.#lost = new StorageError(
      `${this.store}Store lost its claim on intent ${JSON.stringify(this.id)}: ${reason}; another driver may have started`,
      cause === undefined ? undefined : { cause },
    )
    this.sink()?.('claim-lost', { store: this.store, id: this.id, reason, error: this.#lost })
  }

  /**
   * Keeps a lease of `leaseMs`, taken at `since`, alive until the section ends: every `leaseMs / 3`, one at a time,
   * `renew(until)` extends it to `until`. The claim is lost when a renewal reports a lapse or fails, when the lease
   * ran out before a renewal succeeded, and when it ran out by the time the section ends. The timer does not keep
   * the process alive.
   */
  lease(leaseMs: number, since: number, renew: (until: number) => Promise<Lapse | undefined>): void {
    this.#until = since + leaseMs
    let renewing: Promise<void> | undefined
    const timer = setInterval(() => {
      if (renewing) return
      if (this.#lost || this.#late()) return clearInterval(timer)
      const next = Date.now() + leaseMs
      renewing = renew(next)
        .then(
          (lapse) => {
            if (lapse) this.lose(lapse.reason, lapse.cause)
            else this.#until = next
          },
          (error: unknown) => this.lose('its lease could not be renewed', error),
        )
        .then(() => {
          renewing = undefined
        })
    }, leaseMs / 3)
    ;(timer as { unref?: () => void }).unref?.()
    // The release waits for a renewal in flight, or that renewal could land after it (a ghost claim).
    this.#stopRenewal = async () => {
      clearInterval(timer)
      await renewing
    }
  }

  /**
   * Runs the section, stops the lease renewal, then runs `release` (which should leave the lock of a lost claim
   * alone: it may be another driver's by then), and rejects with the loss if there was one and the section itself
   * succeeded.
   */
  async run<T>(section: () => Promise<T>, release: () => Promise<void>): Promise<T> {
    let value: T
    try {
      value = await section()
    } finally {
      await this.#stopRenewal?.()
      this.#late()
      await release()
    }
    if (this.#lost) throw this.#lost
    return value
  }

  #late(): boolean {
    if (Date.now() >= this.#until) this.lose('its lease ran out before it was renewed')
    return this.#lost !== undefined
  }
}
