import { type DriveContext, drive } from './drive.js'
import { IdempotencyKeyReusedError } from './errors/idempotency-key-reused-error.js'
import { IntentExpiredError } from './errors/intent-expired-error.js'
import { OncelyError } from './errors/oncely-error.js'
import type { IntentRecord } from './intent.js'
import { httpErrorFor, type OncelyResponse, parseData } from './response.js'
import type { ExclusiveResult } from './store.js'
import { sleep } from './timers.js'

/** A run's result: the response, or why this tab or process did not drive the intent. */
export type Driven = OncelyResponse | { skipped: 'busy' | 'not-pending' }

/** How a section gets its claim on an intent: the store's `exclusive`, or its `create` for a brand-new intent. */
type Hold = (section: () => Promise<void>) => Promise<ExclusiveResult<void> | undefined>

/**
 * Drives the intents of one client: one run per intent in this process (a second call joins the first), each under
 * the store's claim across tabs and processes, answering as soon as the run has its outcome while the release of
 * the claim finishes in the background.
 */
export class Driver {
  readonly #inflight = new Map<string, { request: IntentRecord | undefined; promise: Promise<Driven> }>()
  readonly #background = new Set<Promise<unknown>>()

  constructor(readonly ctx: DriveContext) {}

  /**
   * Runs `run` for intent `id`, or joins the run of it already going on in this process; `request` is the record
   * a new call wants, which must match the running one's target and bytes.
   */
  track(id: string, request: IntentRecord | undefined, run: () => Promise<Driven>): Promise<Driven> {
    const existing = this.#inflight.get(id)
    if (existing) {
      if (request && existing.request && !sameRequest(existing.request, request)) {
        return Promise.reject(reusedLocally(existing.request))
      }
      return existing.promise
    }
    const promise = run().finally(() => this.#inflight.delete(id))
    this.#inflight.set(id, { request, promise })
    return promise
  }

  /** Resolves once the claims released in the background are released (their failures are ignored). */
  async drained(): Promise<void> {
    while (this.#background.size > 0) await Promise.all(this.#background)
  }

  /** Runs `fn` under the store's claim on `id` (directly when the store has none). */
  exclusive<T>(id: string, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
    const store = this.ctx.store
    return this.#claimed(
      (section) =>
        store.exclusive
          ? store.exclusive(id, section)
          : section().then(() => ({ acquired: true, value: undefined })),
      fn,
    )
  }

  /**
   * Writes the write-ahead record of a brand-new intent and runs `fn` as its driver, through the store's `create`
   * (one write, no claim before the first byte); undefined when the store has no `create`.
   */
  create<T>(record: IntentRecord, fn: () => Promise<T>): Promise<T> | undefined {
    const store = this.ctx.store
    if (!store.create) return undefined
    return this.#claimed((section) => store.create!(record, section).then(() => undefined), fn).then(
      (result) => (result as { value: T }).value,
    )
  }

  /** Drives a stored intent under its claim, reading it once the claim is held; waits its turn when `wait`. */
  async driveStored(
    id: string,
    transient: Record<string, string>,
    signal: AbortSignal | undefined,
    wait: boolean,
  ): Promise<Driven> {
    for (;;) {
      const result = await this.exclusive(id, async (): Promise<Driven> => {
        const record = await this.ctx.store.get(id)
        if (!record) return { skipped: 'not-pending' }
        if (record.state !== 'pending') return outcomeOf(record)
        return drive(this.ctx, record, transient, signal)
      })
      if (result.acquired) return result.value
      if (!wait) return { skipped: 'busy' }
      await sleep(this.ctx.timers, 250, signal)
    }
  }

  // Runs `fn` under a claim and answers as soon as `fn` does; the release of the claim finishes in the background
  // (pending(), resume() and close() wait for it). A claim lost after the answer is reported by the store's
  // `claim-lost` event only.
  #claimed<T>(hold: Hold, fn: () => Promise<T>): Promise<ExclusiveResult<T>> {
    return new Promise((resolve, reject) => {
      let answered = false
      let held: Promise<unknown> | undefined
      const section = async () => {
        try {
          resolve({ acquired: true, value: await fn() })
        } catch (error) {
          reject(error)
        }
        answered = true
        if (held) this.#inBackground(held)
      }
      held = hold(section).then(
        (result) => {
          if (result && !result.acquired) resolve({ acquired: false })
        },
        (error: unknown) => {
          if (!answered) reject(error)
        },
      )
      if (answered) this.#inBackground(held)
    })
  }

  #inBackground(work: Promise<unknown>): void {
    const tracked: Promise<unknown> = work.catch(() => {}).finally(() => this.#background.delete(tracked))
    this.#background.add(tracked)
  }
}

/** Whether two records of one intent carry the same request: method, URL and body bytes. */
export function sameRequest(a: IntentRecord, b: IntentRecord): boolean {
  return (
    a.method === b.method &&
    a.url === b.url &&
    JSON.stringify(a.body ?? null) === JSON.stringify(b.body ?? null)
  )
}

/** The error for an `intentId` reused for another request while the first is still known. */
export function reusedLocally(existing: IntentRecord): IdempotencyKeyReusedError {
  return new IdempotencyKeyReusedError(422, {
    headers: new Headers(),
    data: undefined,
    message: `Intent ${existing.id} is already recorded as ${existing.method} ${existing.url} with other bytes or target; use another intentId`,
  })
}

/**
 * The recorded outcome of a settled or failed intent, as the original call returned or threw it, answered from
 * the store (`source: 'store'`).
 */
export function outcomeOf(record: IntentRecord): Promise<OncelyResponse> {
  if (record.state === 'expired') {
    return Promise.reject(
      new IntentExpiredError({ intentId: record.id, key: record.key, expiresAt: record.expiresAt }),
    )
  }
  const recorded = record.outcome
  if (!recorded)
    return Promise.reject(new OncelyError(`Intent ${record.id} ended without a recorded response`))
  const headers = new Headers(recorded.headers)
  if (record.state === 'failed') return Promise.reject(httpErrorFor(recorded.status, headers, recorded.text))
  return Promise.resolve({
    status: recorded.status,
    headers,
    data: parseData(recorded.text, headers),
    key: record.key,
    intentId: record.id,
    replayed: recorded.replayed,
    source: 'store',
    attempts: record.attempts,
  })
}
