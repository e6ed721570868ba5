import type { ResumeOutcome } from './resume.js'
import type { StoreEvents } from './store.js'

/** An intent that `resume()` brought to an outcome, with its target (see the `resumed` event). */
export type ResumedIntent = Extract<ResumeOutcome, { outcome: 'settled' | 'failed' }> & {
  /** HTTP method, upper case. */
  method: string
  /** The absolute URL. */
  url: string
}

/** Events of `client.on`. */
export interface ClientEvents extends StoreEvents {
  /** An attempt is about to be sent. `attempt` counts over every run and process (it is the `Oncely-Attempt` header). */
  attempt: { id: string; key: string; attempt: number; method: string; url: string }
  /** A retry is scheduled after `delayMs`; `reason` names the cause, such as `status 503` or `network`. */
  retry: {
    id: string
    key: string
    attempt: number
    delayMs: number
    retryAfter: boolean
    reason: string
    error: Error
  }
  /** The intent completed with a 2xx/3xx response; `source` says whether the server executed it or replayed it. */
  settled: {
    id: string
    key: string
    status: number
    replayed: boolean
    source: 'network' | 'replay'
    attempts: number
  }
  /** A run ended with an error. `pending` is true when the intent stays pending (retry budget exhausted). */
  failed: { id: string; key: string; error: Error; pending: boolean }
  /**
   * `resume()` (called directly, at start, on `online` or when the page became visible) settled or failed a pending
   * intent left by an earlier run, page or process: the same outcome `resume()` returns for it, plus its method and
   * URL, so an app can update what the intent affects (caches, a toast) although nobody awaits that call.
   */
  resumed: ResumedIntent
  /** The intent outlived `intentTtlMs` unconfirmed: outcome unknown, never resent. */
  expired: { id: string; key: string; createdAt: number; expiresAt: number }
}
