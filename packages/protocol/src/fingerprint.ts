import { canonicalJson } from './json.js'
import { sha256Hex } from './sha256.js'

/** What a request fingerprint covers. */
export interface FingerprintInput {
  /** HTTP method (or another verb for non-HTTP operations), compared case-insensitively. */
  method: string
  /** The route template, such as `/v1/payments/:id`, never the raw URL (so path parameters are in `body` or `query`). */
  route: string
  /** The parsed body. `undefined` means no body. */
  body?: unknown
  /** Query parameters, only for routes that opt in. */
  query?: Record<string, unknown> | undefined
}

/**
 * The exact text a fingerprint hashes: method, route template, canonical JSON of the body and, when given, of the
 * query, joined by newlines. Exposed so servers can hash it with a native SHA-256 and get the same fingerprint.
 */
export function fingerprintMaterial(input: FingerprintInput): string {
  const body = input.body === undefined ? '' : canonicalJson(input.body)
  const material = `${input.method.toUpperCase()}\n${input.route}\n${body}`
  return input.query === undefined ? material : `${material}\n${canonicalJson(input.query)}`
}

/**
 * SHA-256 (hex) over method, route template and the canonical JSON of the parsed body (RFC 8785), so two requests
 * that differ only in key order or whitespace have the same fingerprint.
 *
 * @example
 * requestFingerprint({ method: 'POST', route: '/v1/payments', body: { amount: 100, currency: 'eur' } })
 */
export function requestFingerprint(input: FingerprintInput): string {
  return sha256Hex(fingerprintMaterial(input))
}
