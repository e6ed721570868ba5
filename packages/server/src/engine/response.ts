import { PROBLEM_CONTENT_TYPE, problem } from '@oncely/protocol'
import type { ResponseTooLargeError } from '../errors.js'
import type { HandlerResponse, StoredResponse } from './types.js'

/**
 * Response headers replayed by default: those that describe the representation or the created resource. Never
 * `set-cookie` (a replay must not hand out a session) and nothing hop-by-hop.
 */
export const DEFAULT_REPLAY_HEADERS: readonly string[] = [
  'content-type',
  'content-language',
  'content-location',
  'content-disposition',
  'location',
  'etag',
  'last-modified',
  'cache-control',
  'expires',
  'link',
  'vary',
]

/** Headers that may never be stored, whatever an allowlist says. */
export const FORBIDDEN_REPLAY_HEADERS: ReadonlySet<string> = new Set([
  'set-cookie',
  'authorization',
  'proxy-authorization',
  'www-authenticate',
  'connection',
  'transfer-encoding',
  'content-length',
  'keep-alive',
])

/** Turns what a handler returned into exact bytes and the allowlisted headers. */
export function normalizeResponse(response: HandlerResponse, allowlist: ReadonlySet<string>): StoredResponse {
  const headers: Record<string, string> = {}
  const given = response.headers
  for (const name in given) {
    const value = given[name]
    const lower = name.toLowerCase()
    if (value === undefined || !allowlist.has(lower)) continue
    headers[lower] = Array.isArray(value) ? value.join(', ') : String(value)
  }
  const { body } = response
  let bytes: Buffer
  if (body === undefined || body === null) bytes = Buffer.alloc(0)
  else if (Buffer.isBuffer(body)) bytes = body
  else if (body instanceof Uint8Array) bytes = Buffer.from(body.buffer, body.byteOffset, body.byteLength)
  else if (typeof body === 'string') {
    bytes = Buffer.from(body, 'utf8')
    headers['content-type'] ??= 'text/plain; charset=utf-8'
  } else {
    bytes = Buffer.from(JSON.stringify(body), 'utf8')
    headers['content-type'] ??= 'application/json; charset=utf-8'
  }
  const status = response.status ?? 200
  if (!Number.isInteger(status) || status < 100 || status > 599) {
    throw new TypeError(`Expected the handler's \`status\` to be an HTTP status code, got ${status}.`)
  }
  return { status, headers, body: bytes }
}

/**
 * What is stored in place of a response over `maxResponseBytes`: the `response_too_large` problem. It is stored (as
 * a permanent failure, with the handler's writes rolled back) rather than released, because a retry would run the
 * handler again, external calls included, only to produce the same response that cannot be stored.
 */
export function tooLargeResponse(error: ResponseTooLargeError): StoredResponse {
  const details = problem('response_too_large', `${error.message} Nothing the handler wrote was committed.`)
  return {
    status: details.status,
    headers: { 'content-type': PROBLEM_CONTENT_TYPE },
    body: Buffer.from(JSON.stringify(details)),
  }
}
