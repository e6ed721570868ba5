import { canonicalJson } from './json.js'
import { sha256Hex } from './sha256.js'

/** What a request fingerprint covers. */
export interface FingerprintInput {
  /** HTTP method (or another verb for non-HTTP operations), compared case-insensitively. */
  method: string
  /** The route template, such as `/v1/payments/:id`, never the raw URL. */
  route: string
  /**
   * The request's path as the router matched it, percent-decoded, with its parameter values, such as
   * `/v1/payments/p_1`: two requests on one route that act on different resources differ here. A path equal to
   * `route` adds nothing, so a route without parameters fingerprints the same with or without it.
   */
  path?: string | undefined
  /** The parsed body. `undefined` means no body. */
  body?: unknown
  /** Query parameters, only for routes that opt in. */
  query?: Record<string, unknown> | undefined
}

/**
 * The exact text a fingerprint hashes: method, route template, canonical JSON of the body, then, when given, the
 * canonical JSON of the query and the path as a JSON string (when it is not the route itself), joined by newlines.
 * Neither JSON form holds a newline, and the query's starts with `{` where the path's starts with `"`, so no two
 * inputs share a text. Exposed so servers can hash it with a native SHA-256 and get the same fingerprint.
 */
export function fingerprintMaterial(input: FingerprintInput): string {
  const body = input.body === undefined ? '' : canonicalJson(input.body)
  let material = `${input.method.toUpperCase()}\n${input.route}\n${body}`
  if (input.query !== undefined) material += `\n${canonicalJson(input.query)}`
  if (input.path !== undefined && input.path !== input.route) material += `\n${JSON.stringify(input.path)}`
  return material
}

/**
 * SHA-256 (hex) over method, route template, the canonical JSON of the parsed body (RFC 8785) and, when given, of
 * the query and the path, so two requests that differ only in key order or whitespace have the same fingerprint.
 *
 * @example
 * requestFingerprint({ method: 'POST', route: '/v1/payments', body: { amount: 100, currency: 'eur' } })
 * requestFingerprint({ method: 'POST', route: '/v1/accounts/:id/transfers', path: '/v1/accounts/A/transfers', body: {} })
 */
export function requestFingerprint(input: FingerprintInput): string {
  return sha256Hex(fingerprintMaterial(input))
}
