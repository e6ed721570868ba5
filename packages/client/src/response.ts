import { IDEMPOTENT_REPLAYED_HEADER, isProblemDetails } from '@oncely/protocol'
import { HTTPError } from './errors/http-error.js'
import { IdempotencyKeyReusedError } from './errors/idempotency-key-reused-error.js'
import type { StoredResponse } from './intent.js'

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
  /** True when the server said this is a stored response (`Idempotent-Replayed: true`). */
  replayed: boolean
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

/** Copies response headers for storage, without `set-cookie`, which must never be replayed. */
export function storableResponse(status: number, headers: Headers, text: string): StoredResponse {
  const out: Record<string, string> = {}
  headers.forEach((value, name) => {
    if (name !== 'set-cookie') out[name] = value
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
