import { randomBytes } from 'node:crypto'
import { unlink } from 'node:fs/promises'
import { join } from 'node:path'
import type { HeldClaim } from '../claim.js'
import { replaceFile } from './fs.js'
import type { LockFiles } from './lock.js'

/**
 * A store's claim on the intents it creates, held for the store's life: an owner file `<token>.owner` naming this
 * process, renewed every `leaseMs / 3`. A new intent's write-ahead record names the token, and no other process
 * drives an intent whose owner is alive, so the store needs no per-intent lock before the first byte. When the
 * store lets go of an intent (its run ended with the intent still pending) it appends a version naming no owner.
 *
 * If a renewal fails or comes too late (the event loop was blocked for longer than the lease), another process may
 * have judged the owner gone and started on one of its intents: every section driving an intent on the strength
 * of this owner loses its claim (see {@link HeldClaim}), and the owner file is written afresh.
 */
export class FileOwner {
  /** 16 hex digits, as slot and owner file names expect. */
  readonly token = randomBytes(8).toString('hex')
  /** The sections driving an intent on the strength of this owner, by intent id. */
  readonly sections = new Map<string, HeldClaim>()
  #ready: Promise<void> | undefined
  #until = 0
  #timer: ReturnType<typeof setInterval> | undefined
  #renewing: Promise<void> | undefined

  constructor(
    readonly dir: string,
    readonly locks: LockFiles,
  ) {}

  /** The owner file of `token`. */
  path(token = this.token): string {
    return join(this.dir, `${token}.owner`)
  }

  /** Writes the owner file once (again after a failure) and starts renewing it. */
  ready(): Promise<void> {
    this.#ready ??= (async () => {
      const until = Date.now() + this.locks.leaseMs
      if (!(await this.locks.create(this.path(), await this.locks.text(until, this.token)))) {
        throw new Error(`owner file ${this.path()} already exists`)
      }
      this.#until = until
      this.#timer = setInterval(() => {
        this.#renewing ??= this.#renew().finally(() => {
          this.#renewing = undefined
        })
      }, this.locks.leaseMs / 3)
      this.#timer.unref()
    })().catch((error: unknown) => {
      this.#ready = undefined
      throw error
    })
    return this.#ready
  }

  /** Whether the store owning `token` is alive (this store is). */
  async alive(token: string): Promise<boolean> {
    return token === this.token || (await this.locks.inspect(this.path(token))) === 'held'
  }

  /** Stops renewing and removes the owner file: this store's intents are any process's to drive from now on. */
  async close(): Promise<void> {
    clearInterval(this.#timer)
    await this.#renewing
    if (this.#ready) await unlink(this.path()).catch(() => {})
    this.#ready = undefined
  }

  async #renew(): Promise<void> {
    const next = Date.now() + this.locks.leaseMs
    const text = () => this.locks.text(next, this.token)
    const lapse =
      Date.now() >= this.#until
        ? { reason: 'its lease ran out before it was renewed' }
        : await this.locks.renew(this.path(), this.token, text)
    if (!lapse) {
      this.#until = next
      return
    }
    for (const claim of this.sections.values()) {
      claim.lose(`the claim of its store's owner file lapsed (${lapse.reason})`, lapse.cause)
    }
    try {
      await replaceFile(this.path(), await text())
      this.#until = next
    } catch {
      // The next renewal tries again; until then other processes judge this store gone.
    }
  }
}
