/** The persisted form of one user intent. Plain JSON, so every store can keep it as text. */
export interface IntentRecord {
  /** Record format; bumped on incompatible changes. */
  format: 1
  /** The intent's id: the caller's `intentId`, or the key itself for one-off requests. */
  id: string
  /** The `Idempotency-Key` every attempt carries. */
  key: string
  /** HTTP method, upper case. */
  method: string
  /** The absolute URL. */
  url: string
  /** The exact body: UTF-8 text as is, anything else base64. Absent for no body. */
  body?: { encoding: 'utf8' | 'base64'; data: string }
  /** Request headers safe to keep on disk (never `authorization`, `cookie` or headers from the `headers` option). */
  headers: Record<string, string>
  /** When the intent was created, ms since the epoch. */
  createdAt: number
  /** After this instant the intent is never resent (ms since the epoch). */
  expiresAt: number
  /**
   * Which try of a named intent this is: 0 (absent) for the first, n after n tries that ended in a final error and
   * a call with `retryFailed` started another. Each try has a key of its own.
   */
  try?: number
  /** Attempts made so far, over every run and process. */
  attempts: number
  /** Incremented on every write of this record. */
  version: number
  /** `pending` until confirmed; `settled`/`failed` kept for `settledTtlMs`; `expired` until discarded. */
  state: 'pending' | 'settled' | 'failed' | 'expired'
  /** The last attempt's error, for `pending()` and reconciliation. */
  lastError?: { name: string; message: string; status?: number }
  /** The final response, kept while `state` is `settled` or `failed`. */
  outcome?: RecordedResponse
  /** Until when a settled outcome is returned for the same `intentId` (ms since the epoch). */
  keepUntil?: number
}

/**
 * The final response of an intent as its record keeps it (for `settledTtlMs`, when it has an `intentId`): the
 * status, the headers other than `set-cookie` and the hop-by-hop ones, and the body text.
 */
export interface RecordedResponse {
  status: number
  headers: Record<string, string>
  /** Response body text. */
  text: string
  /** Whether the server answered it as a replay of its stored response. */
  replayed: boolean
}

/** A pending intent, as `client.pending()` lists it. */
export interface PendingIntent {
  id: string
  key: string
  method: string
  url: string
  /** `pending`, or `expired` (outcome unknown; call `client.discard(id)` once reconciled). */
  state: 'pending' | 'expired'
  createdAt: number
  expiresAt: number
  attempts: number
  lastError: IntentRecord['lastError'] | undefined
}

/** True when `value` has the shape of an {@link IntentRecord}; stores use it to reject corrupt entries. */
export function isIntentRecord(value: unknown): value is IntentRecord {
  if (typeof value !== 'object' || value === null) return false
  const r = value as Record<string, unknown>
  return (
    r.format === 1 &&
    typeof r.id === 'string' &&
    typeof r.key === 'string' &&
    typeof r.method === 'string' &&
    typeof r.url === 'string' &&
    typeof r.headers === 'object' &&
    r.headers !== null &&
    typeof r.createdAt === 'number' &&
    typeof r.expiresAt === 'number' &&
    typeof r.attempts === 'number' &&
    typeof r.version === 'number' &&
    (r.state === 'pending' || r.state === 'settled' || r.state === 'failed' || r.state === 'expired')
  )
}
