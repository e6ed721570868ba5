import type { HeldClaim } from '../claim.js'

// How long a tab keeps its owner Web Lock after its last owned intent settled: held while mutations keep coming
// (taking it costs a Web Lock round trip), let go when idle (a page holding a Web Lock may not enter the
// back/forward cache).
const OWNER_IDLE_MS = 3_000

/**
 * A tab's claim on the intents it creates: a Web Lock named after a random token, taken before the tab writes its
 * first intent naming that token and held while it drives such intents (and for {@link OWNER_IDLE_MS} after the
 * last one, so a stream of mutations takes it once). Another tab sees the owner alive while that Web Lock is held;
 * the browser lets go of it when the tab closes or crashes. If it is ever stolen, every intent driven on its
 * strength loses its claim.
 */
export class TabOwner {
  token: string | undefined
  readonly #sections = new Map<string, HeldClaim>()
  #granted: Promise<void> | undefined
  #release: (() => void) | undefined
  #idle: ReturnType<typeof setTimeout> | undefined

  constructor(readonly name: string) {}

  #lockName(token: string): string {
    return `oncely:${this.name}:owner:${token}`
  }

  /** Registers a section driving intent `id` as this tab's owner, taking the owner Web Lock first if needed. */
  async hold(id: string, claim: HeldClaim): Promise<void> {
    clearTimeout(this.#idle)
    this.#sections.set(id, claim)
    if (!this.#granted) {
      const token = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`
      const granted = new Promise<void>((resolve, reject) => {
        navigator.locks
          .request(this.#lockName(token), { mode: 'exclusive' }, () => {
            this.token = token
            resolve()
            return new Promise<void>((release) => {
              this.#release = release
            })
          })
          .catch((error: unknown) => {
            if (this.token !== token) {
              if (this.#granted === granted) this.#granted = undefined
              return reject(error)
            }
            // Stolen: another context may have judged this tab gone and started on its intents.
            this.#forget()
            for (const section of this.#sections.values())
              section.lose('its tab owner Web Lock was stolen', error)
          })
      })
      this.#granted = granted
    }
    await this.#granted
  }

  /** Unregisters a section; lets go of the owner Web Lock once no section has used it for a while. */
  drop(id: string): void {
    this.#sections.delete(id)
    if (this.#sections.size > 0) return
    clearTimeout(this.#idle)
    this.#idle = setTimeout(() => {
      if (this.#sections.size === 0) this.#forget()
    }, OWNER_IDLE_MS)
  }

  /** Whether the tab that took the owner Web Lock `token` still holds it (this tab does). */
  async alive(token: string): Promise<boolean> {
    if (token === this.token) return true
    const state = await navigator.locks.query()
    return (state.held ?? []).some((lock) => lock.name === this.#lockName(token))
  }

  /** Lets go of the owner Web Lock. */
  close(): void {
    clearTimeout(this.#idle)
    this.#forget()
  }

  #forget(): void {
    this.#release?.()
    this.#release = undefined
    this.#granted = undefined
    this.token = undefined
  }
}
