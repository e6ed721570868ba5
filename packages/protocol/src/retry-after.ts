/**
 * `Retry-After` (RFC 9110, section 10.2.3): either delta-seconds or an HTTP-date.
 *
 * An HTTP-date is measured against the response's own `Date` header when there is one, so a client whose clock is
 * wrong still waits the interval the server meant.
 */

/** Options for {@link parseRetryAfter}. */
export interface ParseRetryAfterOptions {
  /** The response's `Date` header; an HTTP-date is measured from it when present and valid. */
  date?: string | null | undefined
  /** The current time in ms since the epoch, used when there is no usable `Date` header. @default Date.now() */
  now?: number
}

const DELTA_SECONDS = /^\d+$/
// All three HTTP-date formats (IMF-fixdate, RFC 850, asctime) start with a day name; Date.parse alone accepts '-1'.
const HTTP_DATE = /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? /

/**
 * Parses a `Retry-After` value into milliseconds to wait (never negative), or `undefined` when absent or invalid
 * (delta-seconds beyond 2^53 - 1 are invalid: they cannot be held exactly).
 *
 * @example
 * parseRetryAfter('3') // 3000
 * parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', { date: 'Wed, 21 Oct 2015 07:27:58 GMT' }) // 2000
 */
export function parseRetryAfter(
  value: string | null | undefined,
  options: ParseRetryAfterOptions = {},
): number | undefined {
  if (value === null || value === undefined) return undefined
  const trimmed = value.trim()
  if (trimmed === '') return undefined
  if (DELTA_SECONDS.test(trimmed)) {
    const seconds = Number(trimmed)
    return Number.isSafeInteger(seconds) ? seconds * 1000 : undefined
  }
  if (!HTTP_DATE.test(trimmed)) return undefined
  const at = Date.parse(trimmed)
  if (Number.isNaN(at)) return undefined
  const serverNow = options.date ? Date.parse(options.date) : Number.NaN
  const reference = Number.isNaN(serverNow) ? (options.now ?? Date.now()) : serverNow
  return Math.max(0, at - reference)
}

/** The largest delta-seconds written: 2^31, which RFC 9111 (section 1.2.2) has caches use for any larger value. */
const MAX_DELTA_SECONDS = 2_147_483_648

/**
 * Formats a wait in milliseconds as delta-seconds, rounded up and at least 1, so a client never retries at once
 * because of rounding. A wait over 2^31 seconds (or infinite) is written as 2^31: always digits, never the exponent
 * form `String()` gives from 1e21. `NaN` and waits of 0 or less are written as 1.
 *
 * @example
 * formatRetryAfter(1200) // '2'
 */
export function formatRetryAfter(ms: number): string {
  if (Number.isNaN(ms) || ms <= 0) return '1'
  return String(Math.min(MAX_DELTA_SECONDS, Math.max(1, Math.ceil(ms / 1000))))
}
