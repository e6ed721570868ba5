import type { OncelyClient } from '../client.js'
import { isHTTPError } from '../errors/http-error.js'
import { isIdempotencyKeyReusedError } from '../errors/idempotency-key-reused-error.js'
import type { RequestOptions } from '../request.js'
import { OptionChecks } from '../validate.js'
import { type KyIntent, replayedIn, toResponse } from './response.js'

/**
 * What one ky request tells oncely: `oncely: { ... }` in ky's options, passed by ky to its `fetch` (ky hands every
 * option it does not know itself to `fetch`).
 */
export interface OncelyKyRequestOptions {
  /**
   * A business fact naming the intent, such as `checkout:cart_42`: the key is derived from it, the method and the
   * URL, so the same fact always gives the same key (see `RequestOptions.intentId` of the client).
   * @default none: a one-off intent with a random key
   * @example 'checkout:cart_42'
   */
  intentId?: string
  /**
   * With `intentId`: after a final error (a declined card), start a new try of the intent under a new key instead
   * of answering that error again (see `RequestOptions.retryFailed` of the client).
   * @default false
   * @example true
   */
  retryFailed?: boolean
  /**
   * Called with the intent's id and key once they are minted, before anything is written or sent.
   * @default none
   * @example ({ id, key }) => console.log(`paying as ${key}`)
   */
  onIntent?: (intent: { id: string; key: string }) => void
}

/** What a request's `oncely` option says: not an intent (`false`), an intent with these options, or the default. */
export type Marking = false | OncelyKyRequestOptions | undefined

const KEYS = new Set(['intentId', 'retryFailed', 'onIntent'])

/** Reads and checks a request's `oncely` option, throwing a `TypeError` that names what is wrong. */
export function markingOf(value: unknown): Marking {
  if (value === undefined || value === false) return value
  if (value === true) return {}
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new TypeError(`withOncely: Expected \`oncely\` to be a boolean or an object, got ${String(value)}`)
  }
  const checks = new OptionChecks('withOncely', value)
  for (const name of Object.keys(value)) {
    if (!KEYS.has(name)) checks.problem(`Unknown option \`oncely.${name}\``)
  }
  const { intentId, retryFailed, onIntent } = value as Record<string, unknown>
  checks.nonEmptyString('oncely.intentId', intentId)
  checks.boolean('oncely.retryFailed', retryFailed)
  checks.fn('oncely.onIntent', onIntent)
  checks.done()
  return value as OncelyKyRequestOptions
}

/**
 * Sends the Request ky built as an intent of `client`: its method, URL, headers and exact body bytes are written
 * ahead and driven by the client's one retry loop. A final answer becomes the Response ky goes on with; an error
 * with no answer of the server to this request (retries exhausted, the store failed, the key was used for other
 * bytes, ...) rejects with the client's error, which ky passes on unchanged.
 */
export async function sendIntent(
  client: OncelyClient,
  request: Request,
  options: OncelyKyRequestOptions,
): Promise<Response> {
  const headers: Record<string, string> = {}
  request.headers.forEach((value, name) => {
    headers[name] = value
  })
  let intent: { id: string; key: string } | undefined
  const call: RequestOptions = {
    method: request.method,
    path: request.url,
    headers,
    signal: request.signal,
    onIntent: (minted) => {
      intent = minted
      options.onIntent?.(minted)
    },
  }
  if (request.body !== null) {
    const bytes = new Uint8Array(await request.arrayBuffer())
    // As text only with a content type of its own: the client labels a text body without one text/plain.
    call.body = request.headers.has('content-type') ? bodyOf(bytes) : bytes
  }
  if (options.intentId !== undefined) call.intentId = options.intentId
  if (options.retryFailed !== undefined) call.retryFailed = options.retryFailed
  try {
    const res = await client.request(call)
    const { intentId, key, replayed, source, attempts } = res
    return toResponse(res.status, res.headers, res.data, { intentId, key, replayed, source, attempts })
  } catch (error) {
    // A 422 is not an answer to these bytes but a refusal of the key (and is raised locally too, with nothing
    // sent): it stays the client's IdempotencyKeyReusedError whatever ky's `throwHttpErrors` says.
    if (!isHTTPError(error) || isIdempotencyKeyReusedError(error) || !intent) throw error
    const answer: KyIntent = {
      intentId: intent.id,
      key: intent.key,
      replayed: replayedIn(error.headers),
      source: undefined,
      attempts: undefined,
    }
    return toResponse(error.status, error.headers, error.data, answer)
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true })

// Text stays text in the intent's record (readable, and a third smaller than base64); other bytes are stored as
// bytes. Valid UTF-8 decodes to exactly one string, which encodes back to the same bytes (the BOM kept).
function bodyOf(bytes: Uint8Array): string | Uint8Array {
  try {
    return utf8.decode(bytes)
  } catch {
    return bytes
  }
}
