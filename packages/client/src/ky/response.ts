import { IDEMPOTENT_REPLAYED_HEADER } from '@oncely/protocol'
import type { ResponseSource } from '../response.js'

/** The intent behind a response of a ky instance wrapped by `withOncely`: see {@link intentOf}. */
export interface KyIntent {
  /** The intent's id: `oncely.intentId`, or the key for a one-off request. */
  intentId: string
  /** The idempotency key every attempt of the intent carried. */
  key: string
  /** True when the server said this is its stored response of an earlier execution (`Idempotent-Replayed: true`). */
  replayed: boolean
  /**
   * Where a success (2xx, 3xx) came from: `'network'`, `'replay'`, or `'store'` (nothing was sent: the same
   * `intentId` settled within `settledTtlMs`). Undefined for a final error status.
   */
  source: ResponseSource | undefined
  /** Attempts made for the intent over every run and process; undefined for a final error status. */
  attempts: number | undefined
}

// The Responses this integration made, each with its intent. Only those objects: a clone made by a hook has none.
const intents = new WeakMap<Response, KyIntent>()

/**
 * The intent behind a response that a ky instance wrapped by `withOncely` resolved with (or put on its
 * `HTTPError.response`): its id, key, and where the answer came from. `undefined` for a response that did not go
 * through oncely (a GET, a request marked `oncely: false`), or for a copy of one (`response.clone()`).
 *
 * @example
 * const response = await api.post('v1/payments', { json: { amount: 100 } })
 * console.log(intentOf(response)?.key, intentOf(response)?.source)
 */
export function intentOf(response: Response): KyIntent | undefined {
  return intents.get(response)
}

// Statuses whose responses have no body (the Response constructor refuses one).
const NULL_BODY = new Set([101, 103, 204, 205, 304])

/**
 * The answer the client gave, as the Response ky expects. The client has already read the body and parsed JSON, so
 * JSON is serialized again (the same value, not necessarily the same bytes: whitespace and number spelling may
 * differ) and text is passed on as it was. The headers that described the body's bytes on the wire go.
 */
export function toResponse(status: number, headers: Headers, data: unknown, intent: KyIntent): Response {
  const out = new Headers(headers)
  out.delete('content-length')
  out.delete('content-encoding')
  const response = new Response(NULL_BODY.has(status) ? null : bodyText(data, out), { status, headers: out })
  intents.set(response, intent)
  return response
}

function bodyText(data: unknown, headers: Headers): string | null {
  if (data === undefined) return null
  // The client parsed a JSON content type into a value (a body labelled JSON that did not parse stayed text, and
  // is serialized here as a JSON string of that text: the value the client gave). Other bodies are text.
  return /[/+]json\b/i.test(headers.get('content-type') ?? '') ? JSON.stringify(data) : String(data)
}

/** Whether the server marked the answer as its stored response. */
export function replayedIn(headers: Headers): boolean {
  return headers.get(IDEMPOTENT_REPLAYED_HEADER)?.toLowerCase() === 'true'
}
