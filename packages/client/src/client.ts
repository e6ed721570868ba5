import { watchConnectivity } from './browser.js'
import type { DriveContext } from './drive.js'
import { Driver } from './driver.js'
import { Emitter } from './emitter.js'
import type { ClientEvents } from './events.js'
import type { IntentRecord, PendingIntent } from './intent.js'
import { mutationOf } from './mutation.js'
import { type ClientOptions, resolveOptions } from './options.js'
import { type RequestOptions, request } from './request.js'
import type { OncelyResponse } from './response.js'
import { type ResumeOutcome, resume } from './resume.js'
import type { IntentStore } from './store.js'
import { defaultTimers } from './timers.js'

/** The oncely client: see `createClient`. */
export interface OncelyClient {
  /** Sends a mutation with an idempotency key, writing the intent before the first byte and retrying safely. */
  request<T = unknown>(options: RequestOptions): Promise<OncelyResponse<T>>
  /** A reusable function for one endpoint: `(json, options?) => client.request(...)`. */
  mutation<TBody = unknown, T = unknown>(
    definition: Omit<RequestOptions, 'json' | 'body' | 'intentId' | 'signal' | 'onIntent'>,
  ): (
    json: TBody,
    options?: Pick<RequestOptions, 'intentId' | 'retryFailed' | 'signal' | 'headers' | 'onIntent'>,
  ) => Promise<OncelyResponse<T>>
  /** Intents not confirmed yet (pending, or expired with an unknown outcome). */
  pending(): Promise<PendingIntent[]>
  /**
   * Re-drives every pending intent with its original key and bytes, oldest first and at most `resumeConcurrency`
   * at a time; returns each outcome. An intent that fails does not stop the others. Also deletes the recorded
   * outcomes whose `settledTtlMs` is over.
   */
  resume(): Promise<ResumeOutcome[]>
  /** Forgets an intent (for example after reconciling an expired one); durable once it resolves. */
  discard(id: string): Promise<void>
  /** Subscribes to an event; returns the unsubscribe function. */
  on<E extends keyof ClientEvents>(event: E, listener: (payload: ClientEvents[E]) => void): () => void
  /** Removes browser listeners and closes the store. Pending intents stay in the store. */
  close(): Promise<void>
}

/**
 * Creates a client whose store defaults to `fallbackStore()`: each entry point of the package (browsers, and Node
 * or React Native) passes its own, so neither pulls in the other's store.
 */
export function createClientWith(options: ClientOptions, fallbackStore: () => IntentStore): OncelyClient {
  const resolved = resolveOptions(options)
  const events = new Emitter<ClientEvents>()
  const store: IntentStore = options.store ?? fallbackStore()
  store.attach?.((event, payload) => events.emit(event, payload as ClientEvents[typeof event]))
  const ctx: DriveContext = {
    store,
    events,
    timers: options.timers ?? defaultTimers,
    random: options.random ?? Math.random,
    retry: resolved.retry,
    timeoutMs: resolved.timeoutMs,
    settledTtlMs: resolved.settledTtlMs,
    fetch: options.fetch,
    headers: options.headers,
  }
  const driver = new Driver(ctx)
  const send = (req: RequestOptions) => request(driver, resolved, req)

  let resuming: Promise<ResumeOutcome[]> | undefined
  const resumeOnce = (): Promise<ResumeOutcome[]> => {
    resuming ??= resume(driver, resolved).finally(() => {
      resuming = undefined
    })
    return resuming
  }
  const stopWatching =
    options.resumeOnOnline !== false ? watchConnectivity(() => void resumeOnce().catch(() => {})) : () => {}
  if (options.resumeOnStart) queueMicrotask(() => void resumeOnce().catch(() => {}))

  return {
    request: send as OncelyClient['request'],
    mutation: mutationOf(send),
    async pending() {
      // This process's answered intents are no longer pending once their claims are released; list after that.
      await driver.drained()
      return (await store.list()).filter(isUnconfirmed).map(
        (r): PendingIntent => ({
          id: r.id,
          key: r.key,
          method: r.method,
          url: r.url,
          state: r.state,
          createdAt: r.createdAt,
          expiresAt: r.expiresAt,
          attempts: r.attempts,
          lastError: r.lastError,
        }),
      )
    },
    resume: resumeOnce,
    discard: (id) => store.delete(id),
    on: (event, listener) => events.on(event, listener),
    async close() {
      stopWatching()
      await driver.drained()
      await store.close?.()
    },
  }
}

function isUnconfirmed(r: IntentRecord): r is IntentRecord & { state: 'pending' | 'expired' } {
  return r.state === 'pending' || r.state === 'expired'
}
