import * as crypto from 'node:crypto'
import {
  type FingerprintInput,
  fingerprintMaterial,
  JsonSyntaxError,
  type ProblemDetails,
  parseStrictJson,
  problem,
} from '@oncely/protocol'
import type { ResolvedRoute } from './options.js'

/** Reads one request header by its lower-case name, as the framework has it. */
export type HeaderReader = (name: string) => string | readonly string[] | null | undefined

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])

/** GET, HEAD and OPTIONS: never idempotency-checked (they must not change anything). Expects upper case. */
export const isSafeMethod = (method: string): boolean => SAFE_METHODS.has(method)

/** The body limit when a route sets none (Fastify's own default, so every adapter agrees). */
export const DEFAULT_MAX_BODY_BYTES = 1_048_576

const first = (value: string | readonly string[] | null | undefined): string | undefined =>
  value === null || value === undefined ? undefined : typeof value === 'string' ? value : value[0]

/** True when the request announces a body (a non-zero length, or a chunked one). */
export function announcesBody(header: HeaderReader): boolean {
  const length = first(header('content-length'))
  return header('transfer-encoding') != null || (length !== undefined && length !== '0')
}

/** The media type of the request, lower-case, without parameters. */
function mediaType(header: HeaderReader): string {
  const value = first(header('content-type'))
  // The header almost every JSON client sends, answered without splitting or lower-casing a copy.
  if (value === 'application/json') return value
  return (value ?? '').split(';')[0]!.trim().toLowerCase()
}

/**
 * The checks made from the headers alone, before a byte of the body is read (so before anything is reserved): a
 * body that is not JSON is 415, a `Content-Length` over the limit is 413.
 */
export function headerProblem(header: HeaderReader, maxBodyBytes: number): ProblemDetails | undefined {
  if (!announcesBody(header)) return undefined
  if (mediaType(header) !== 'application/json') return unsupportedMediaType()
  const length = Number(first(header('content-length')))
  if (length > maxBodyBytes) return payloadTooLarge()
  return undefined
}

export const unsupportedMediaType = () =>
  problem('unsupported_media_type', 'Send the body as application/json.')
export const payloadTooLarge = () =>
  problem('payload_too_large', 'The request body exceeds the limit of this route.')

/** The parsed body of a request, or the problem that rejects it before anything is reserved. */
export type BodyResult = { ok: true; body: unknown } | { ok: false; problem: ProblemDetails }

/**
 * JSON text must be UTF-8 (RFC 8259, and I-JSON, RFC 7493, the input of canonical JSON). A lenient decoder turns
 * every invalid sequence into U+FFFD, so two bodies differing only in their invalid bytes would decode alike and share
 * a fingerprint; this one throws instead (natively, without a pass in JavaScript). A byte order mark at the start is
 * dropped (`ignoreBOM: false`), as RFC 8259 allows and as Fastify's and Express's own JSON parsers do: it is not
 * part of the JSON text, so a body with one fingerprints like the same body without. Anywhere else it is U+FEFF.
 */
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false })

/**
 * Parses a JSON body, given as the bytes received, strictly: bytes that are not UTF-8, duplicate member names,
 * integers beyond 2^53 and lone surrogates are 400 `invalid_json`, because each makes two different requests
 * fingerprint alike (or leaves one without a canonical form). No bytes without a JSON content type means no body.
 */
export function parseBody(bytes: Uint8Array, header: HeaderReader): BodyResult {
  let text: string
  try {
    text = utf8.decode(bytes)
  } catch {
    return {
      ok: false,
      problem: problem('invalid_json', 'The body is not valid UTF-8; JSON text must be UTF-8.'),
    }
  }
  return parseBodyText(text, header)
}

/**
 * {@link parseBody} for a body a framework already read and decoded to text (Hono's cached body): the same strict
 * checks, but for the UTF-8 one, which the decoding made for it (leniently, as the framework's own readers see it).
 */
export function parseBodyText(text: string, header: HeaderReader): BodyResult {
  if (text.length === 0) {
    if (mediaType(header) !== 'application/json') return { ok: true, body: undefined }
    return { ok: false, problem: problem('invalid_json', 'The body is empty; send a JSON value.') }
  }
  try {
    return { ok: true, body: parseStrictJson(text) }
  } catch (error) {
    const detail = error instanceof JsonSyntaxError ? error.message : 'The body is not valid JSON.'
    return { ok: false, problem: problem('invalid_json', detail) }
  }
}

function fingerprintBody(body: unknown, route: ResolvedRoute): unknown {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return body
  const { include, exclude } = route
  if (!include && !exclude) return body
  const picked: Record<string, unknown> = {}
  for (const [field, value] of Object.entries(body)) {
    if (include && !include.includes(field)) continue
    if (exclude?.has(field)) continue
    picked[field] = value
  }
  return picked
}

/**
 * The path of a request target as a Node server receives it (`req.url`): without the query or fragment, and
 * without the scheme and authority of an absolute-form target (`POST http://host/v1/x HTTP/1.1`), which routers
 * match like its path.
 */
export function targetPath(target: string): string {
  let path = target
  if (!path.startsWith('/')) {
    const scheme = path.indexOf('://')
    if (scheme !== -1) {
      const rest = path.slice(scheme + 3)
      const at = rest.search(/[/?#]/)
      path = at === -1 || rest[at] !== '/' ? '/' : rest.slice(at)
    }
  }
  const end = path.search(/[?#]/)
  return end === -1 ? path : path.slice(0, end)
}

const ESCAPE_RUN = /(?:%[0-9A-Fa-f]{2})+/g
const ESCAPE = /%[0-9a-f]{2}/gi

/**
 * Percent-decodes a path the way the routers match it (find-my-way under Fastify, Hono's `getPath`): `decodeURI`,
 * which decodes every escape but those of reserved characters (`%2F` stays, so a decoded slash never reads as a
 * segment boundary), keeping `%25` encoded (so `%2541` never becomes `%41`, then `A`) and leaving an escape that is
 * not UTF-8 as it was. The hex digits of the escapes left are upper-cased (RFC 3986's case normalisation), so
 * `%2f` and `%2F` are one path, as they are one parameter value.
 *
 * @example
 * decodePath('/v1/%6Frders/a%2fb') // '/v1/orders/a%2Fb'
 */
export function decodePath(path: string): string {
  if (!path.includes('%')) return path
  const decoded = path.replace(ESCAPE_RUN, (run) => {
    try {
      return decodeURI(run.replace(/%25/g, '%2525'))
    } catch {
      return run
    }
  })
  return decoded.replace(ESCAPE, (hex) => hex.toUpperCase())
}

/**
 * SHA-256 of a text, in hex: with the one-shot `crypto.hash` where Node has it (20.12 and later), which costs a
 * fingerprint about a third of creating, feeding and finishing a Hash object; else with `createHash`.
 */
const sha256Hex: (text: string) => string =
  typeof crypto.hash === 'function'
    ? (text) => crypto.hash('sha256', text, 'hex')
    : (text) => crypto.createHash('sha256').update(text).digest('hex')

/**
 * The protocol's request fingerprint (method, route template, the decoded path with its parameter values, canonical
 * JSON of the body and, when the route opts in, of the query), hashed with node:crypto rather than the protocol's
 * portable SHA-256.
 */
export function fingerprintOf(
  route: ResolvedRoute,
  request: {
    method: string
    route: string
    path: string
    body: unknown
    /** The parsed query string; called only when the route fingerprints it. */
    query(): Record<string, unknown> | undefined
  },
): string {
  const input: FingerprintInput = {
    method: request.method,
    route: request.route,
    path: request.path,
    body: fingerprintBody(request.body, route),
  }
  if (route.query) input.query = request.query() ?? {}
  return sha256Hex(fingerprintMaterial(input))
}

/**
 * A query string as the fingerprint reads it: each name once, its value a string, or an array when it repeats.
 * Adapters parse it themselves rather than take their framework's parse (Express 4's `qs` makes objects of
 * `a[b]=1`, Express 5's does not), so one request has one fingerprint whatever parses it.
 */
export function queryOf(search: URLSearchParams): Record<string, unknown> {
  const query: Record<string, unknown> = {}
  for (const name of new Set(search.keys())) {
    const values = search.getAll(name)
    query[name] = values.length === 1 ? values[0] : values
  }
  return query
}

/** The query string of a request target (`req.url`), parsed by {@link queryOf}. */
export function targetQuery(target: string): Record<string, unknown> {
  const start = target.indexOf('?')
  if (start === -1) return {}
  const end = target.indexOf('#', start)
  return queryOf(new URLSearchParams(target.slice(start + 1, end === -1 ? undefined : end)))
}

/** The route's allowlisted request headers, to store with the key record. */
export function storedRequestHeaders(
  route: ResolvedRoute,
  request: { header: HeaderReader },
): Record<string, string> | undefined {
  if (route.requestHeaders.length === 0) return undefined
  const out: Record<string, string> = {}
  for (const name of route.requestHeaders) {
    const value = request.header(name)
    if (value !== undefined && value !== null)
      out[name] = typeof value === 'string' ? value : value.join(', ')
  }
  return out
}
