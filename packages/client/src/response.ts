import { IDEMPOTENT_REPLAYED_HEADER, isProblemDetails } from '@oncely/protocol'
import { HTTPError } from './errors/http-error.js'
import { IdempotencyKeyReusedError } from './errors/idempotency-key-reused-error.js'
import type { RecordedResponse } from './intent.js'

/** Where an answer came from: see {@link OncelyResponse.source}. */
export type ResponseSource = 'network' | 'replay' | 'store'

/** What `client.request` resolves with. */
export interface OncelyResponse<T = unknown> {
  /** HTTP status (2xx or 3xx). */
  status: number
  /** Response headers. */
  headers: Headers
  /** The body: parsed JSON for JSON responses, else text; `undefined` when empty. */
  data: T
  /** The idempotency key the request carried. */
  key: string
  /** The intent's id (`intentId`, or the key for one-off requests). */
  intentId: string
  /**
   * True when the server said this is its stored response (`Idempotent-Replayed: true`). For an answer from the
   * local store (`source: 'store'`), whether the server had said so when it first answered.
   */
  replayed: boolean
  /**
   * Where this answer came from: `'network'`, the server executed the request for this call (or for a run this
   * call joined); `'replay'`, the server answered with the stored response of an earlier execution of the same
   * key (`Idempotent-Replayed: true`); `'store'`, nothing was sent: a settled intent with the same `intentId`
   * answered from the local store, within `settledTtlMs`.
   */
  source: ResponseSource
  /** Attempts made for this intent, over every run and process. */
  attempts: number
}

/** Parses a body: JSON when the content type says so (and it parses), otherwise the text. */
export function parseData(text: string, headers: Headers): unknown {
  if (text === '') return undefined
  if (/[/+]json\b/i.test(headers.get('content-type') ?? '')) {
    try {
      return JSON.parse(text)
    } catch {
      return text
    }
  }
  return text
}

// Headers that describe one connection rather than the response (RFC 9110, section 7.6.1), so they mean nothing
// once stored, and `set-cookie`, which must never be replayed.
const UNSTORED = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'set-cookie',
])

/**
 * The response as an intent's record keeps it: its headers without `set-cookie`, the hop-by-hop headers, and any
 * header the `connection` header names.
 */
export function recordedResponse(status: number, headers: Headers, text: string): RecordedResponse {
  const perConnection = new Set(
    (headers.get('connection') ?? '')
      .split(',')
      .map((name) => name.trim().toLowerCase())
      .filter(Boolean),
  )
  const out: Record<string, string> = {}
  headers.forEach((value, name) => {
    if (!UNSTORED.has(name) && !perConnection.has(name)) out[name] = value
  })
  return { status, headers: out, text, replayed: isReplayed(headers) }
}

export function isReplayed(headers: Headers): boolean {
  return headers.get(IDEMPOTENT_REPLAYED_HEADER)?.toLowerCase() === 'true'
}

/** The error for a non-success response; 422 is the key-reuse error. */
export function httpErrorFor(status: number, headers: Headers, text: string): HTTPError {
  const data = parseData(text, headers)
  const problem = isProblemDetails(data) ? data : undefined
  return status === 422
    ? new IdempotencyKeyReusedError(status, { problem, headers, data })
    : new HTTPError(status, { problem, headers, data })
}
