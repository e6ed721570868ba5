import { createHmac, timingSafeEqual } from 'node:crypto'

/**
 * The header that carries the signature: `t=<unix seconds>,v1=<signature>`, where the signature is the HMAC-SHA256
 * of `<t>.<raw body>` with the shared secret, as 64 lowercase hex digits (the scheme Stripe uses). During a secret
 * rotation a sender may add one `v1=` per secret.
 */
export const SIGNATURE_HEADER = 'oncely-signature'

const hmac = (secret: string, timestamp: number, body: string | Buffer) =>
  createHmac('sha256', secret).update(`${timestamp}.`).update(body).digest('hex')

/**
 * Signs a body: HMAC-SHA256 over `<timestamp>.<body>` with the shared secret, as lowercase hex, in the header value
 * `t=<timestamp>,v1=<hex>`. The timestamp is signed too, so a captured request cannot be replayed outside the
 * tolerance window. Send the exact bytes you signed.
 *
 * @example
 * const header = signPayload(body, { secret }) // 't=1700000000,v1=5f2b…'
 */
export function signPayload(body: string | Buffer, options: { secret: string; timestamp?: number }): string {
  if (typeof options?.secret !== 'string' || options.secret === '') {
    throw new TypeError('Expected `secret` to be a non-empty string.')
  }
  const timestamp = options.timestamp ?? Math.floor(Date.now() / 1000)
  return `t=${timestamp},v1=${hmac(options.secret, timestamp, body)}`
}

/** Options of {@link verifySignature}. */
export interface VerifyOptions {
  /** The shared secret, or several during a rotation (any one may match). */
  secret: string | readonly string[]
  /**
   * Largest accepted distance between the signed timestamp and now, in seconds.
   * @default 300
   */
  toleranceSec?: number
  /** The current time in ms (for tests). @default Date.now() */
  now?: number
}

/**
 * Verifies a signature header against the raw body bytes, in constant time. Use the bytes as received, before any
 * JSON parsing: re-serializing changes them. Returns false for a malformed header, a stale timestamp or a bad MAC.
 *
 * @example
 * if (!verifySignature(rawBody, req.headers['oncely-signature'], { secret })) return reply.code(401).send()
 */
export function verifySignature(
  body: string | Buffer,
  header: string | undefined | null,
  options: VerifyOptions,
): boolean {
  const secrets = typeof options?.secret === 'string' ? [options.secret] : options?.secret
  if (
    !Array.isArray(secrets) ||
    secrets.length === 0 ||
    secrets.some((s) => typeof s !== 'string' || s === '')
  ) {
    throw new TypeError('Expected `secret` to be a non-empty string or a list of them.')
  }
  if (typeof header !== 'string') return false
  let timestamp: number | undefined
  const candidates: string[] = []
  for (const part of header.split(',')) {
    const [name, value] = part.trim().split('=', 2)
    if (name === 't' && value && /^\d{1,12}$/.test(value)) timestamp = Number(value)
    else if (name === 'v1' && value && /^[0-9a-f]{64}$/.test(value)) candidates.push(value)
  }
  if (timestamp === undefined || candidates.length === 0) return false
  const toleranceSec = options.toleranceSec ?? 300
  if (Math.abs((options.now ?? Date.now()) / 1000 - timestamp) > toleranceSec) return false
  for (const secret of secrets) {
    const expected = Buffer.from(hmac(secret, timestamp, body), 'hex')
    for (const candidate of candidates) {
      if (timingSafeEqual(expected, Buffer.from(candidate, 'hex'))) return true
    }
  }
  return false
}
