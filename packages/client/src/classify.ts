import { problemType } from '@oncely/protocol'
import isRuntimeNetworkError from 'is-network-error'

/** Statuses retried with the same key. 409 means "still in progress" under the IETF draft; 408 a request timeout. */
export const RETRY_STATUSES: ReadonlySet<number> = new Set([408, 409, 429, 500, 502, 503, 504])

/** Statuses whose `Retry-After` is honoured. */
export const RETRY_AFTER_STATUSES: ReadonlySet<number> = new Set([409, 429, 503])

/**
 * A `Retry-After` at least this long paces the retry itself, so the retry does not count against `retry.limit`
 * (only `retry.maxElapsedMs` bounds it); a shorter one counts, so a server answering `Retry-After: 0` cannot make
 * the client loop without bound.
 */
export const PACED_MIN_MS = 1000

// Problem types that a resend cannot help, whatever their status: the server ran the handler and could not store
// its response, so a resend runs the handler (and its side effects) again.
const PERMANENT_PROBLEMS: ReadonlySet<string> = new Set([problemType('response_too_large')])

/**
 * True when an error status is worth resending with the same key. A replayed answer (`Idempotent-Replayed: true`)
 * is the key's stored outcome and never changes, so it is final whatever its status.
 */
export function isRetryableAnswer(
  status: number,
  replayed: boolean,
  problem: { type?: unknown } | undefined,
): boolean {
  if (replayed || !RETRY_STATUSES.has(status)) return false
  return !(typeof problem?.type === 'string' && PERMANENT_PROBLEMS.has(problem.type))
}

// Messages fetch rejects with when no response arrived, per runtime; is-network-error knows most of them, but
// ignores Safari's "Load failed" when a stack is present, and older Safari and React Native spell it differently.
const NETWORK_MESSAGES = new Set([
  'Failed to fetch', // Chrome
  'NetworkError when attempting to fetch resource.', // Firefox
  'Load failed', // Safari
  'fetch failed', // undici (Node)
  'Network request failed', // React Native (whatwg-fetch)
  'The network connection was lost.', // Safari
])

// undici wraps socket errors: TypeError('fetch failed', { cause: { code: 'ECONNRESET' } }).
const NETWORK_CODES = new Set([
  'ECONNRESET',
  'ECONNREFUSED',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'ENETUNREACH',
  'EHOSTUNREACH',
  'EAI_AGAIN',
  'UND_ERR_SOCKET',
  'UND_ERR_CLOSED',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
])

/** True when `error` means the attempt got no HTTP response, in any runtime's wording. */
export function isFetchNetworkError(error: unknown): boolean {
  if (isRuntimeNetworkError(error)) return true
  if (!(error instanceof Error)) return false
  if (error.name === 'TypeError' && NETWORK_MESSAGES.has(error.message)) return true
  const code = (error.cause as { code?: unknown } | undefined)?.code ?? (error as { code?: unknown }).code
  return typeof code === 'string' && NETWORK_CODES.has(code)
}
