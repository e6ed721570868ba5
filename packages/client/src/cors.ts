// A browser reports a request its CORS rules refused exactly as a network failure ("Failed to fetch"), and hides
// the response headers the server did not expose: the client would retry the first forever and misread the second.
// This tells them apart, in browsers only, for requests to another origin.
import { PROBLEM_TYPE_PREFIX } from '@oncely/protocol'
import { CorsError } from './errors/cors-error.js'
import type { NetworkError } from './errors/network-error.js'
import type { IntentRecord } from './intent.js'
import type { Timers } from './timers.js'

/** What a diagnosis needs from the client. */
export interface CorsContext {
  fetch: typeof fetch | undefined
  timers: Timers
  timeoutMs: number | false
}

// Answers of oncely's server that always carry Retry-After: on one without it, the browser hid the header.
const PACED_PROBLEMS: ReadonlySet<string> = new Set(
  ['request_in_progress', 'store_unavailable', 'lease_expired'].map((code) => PROBLEM_TYPE_PREFIX + code),
)

const PROBE_TIMEOUT_MS = 10_000

/** The origin of `url` when this runs in a browser page or worker of another origin; else `undefined`. */
function foreignOrigin(url: string): string | undefined {
  const here = (globalThis as { location?: { origin?: unknown } }).location?.origin
  if (typeof here !== 'string') return undefined
  const there = new URL(url).origin
  return there === here ? undefined : there
}

/**
 * After an attempt to another origin failed as a network error while the browser is online, asks with safe
 * requests (`HEAD`, no body) whether CORS refused it:
 *
 * 1. `HEAD` with the attempt's headers, which the browser preflights like the attempt: if it passes, the headers
 *    are allowed and the failure was the network's (`'allowed'`; no need to ask again in this run).
 * 2. A `no-cors` `HEAD`, which is never preflighted and resolves whenever the server answers: if it fails, the
 *    server is unreachable (offline, down) and the attempt is retried as usual (`undefined`).
 * 3. A `HEAD` without any header to preflight (if it fails, the server's answers do not allow this origin), and
 *    one `HEAD` per header (those that fail are the headers the preflight refuses), at once.
 *
 * A timed-out attempt is not looked at (a preflight refusal is immediate), nor is anything outside a browser.
 */
export async function diagnoseNetworkError(
  record: IntentRecord,
  headers: Record<string, string>,
  failure: NetworkError,
  ctx: CorsContext,
): Promise<CorsError | 'allowed' | undefined> {
  if (failure.timedOut) return undefined
  const origin = foreignOrigin(record.url)
  if (origin === undefined) return undefined
  if ((globalThis as { navigator?: { onLine?: unknown } }).navigator?.onLine === false) return undefined
  const probe = async (init: RequestInit): Promise<boolean> => {
    const controller = new AbortController()
    const timeout = ctx.timeoutMs === false ? PROBE_TIMEOUT_MS : Math.min(ctx.timeoutMs, PROBE_TIMEOUT_MS)
    const timer = ctx.timers.setTimeout(() => controller.abort(), timeout)
    try {
      const response = await (ctx.fetch ?? globalThis.fetch)(record.url, {
        method: 'HEAD',
        cache: 'no-store',
        ...init,
        signal: controller.signal,
      })
      await response.body?.cancel()
      return true
    } catch {
      return false
    } finally {
      ctx.timers.clearTimeout(timer)
    }
  }
  if (await probe({ headers })) return 'allowed'
  if (!(await probe({ mode: 'no-cors' }))) return undefined
  const names = Object.keys(headers)
  const [plain, ...passes] = await Promise.all(
    [{}, ...names.map((name) => ({ headers: { [name]: headers[name]! } }))].map(probe),
  )
  const blocked = names.filter((_, i) => !passes[i])
  // Every header passes alone: the failure was not about them (or the network failed meanwhile). Retry.
  if (plain && blocked.length === 0) return undefined
  return new CorsError({
    intentId: record.id,
    key: record.key,
    origin,
    corsHeader: plain ? 'Access-Control-Allow-Headers' : 'Access-Control-Allow-Origin',
    headers: plain ? blocked : [],
    cause: failure,
  })
}

/**
 * The error for an answer whose headers the browser hid: a cross-origin (`cors`) answer of oncely's server that
 * always carries `Retry-After` but shows none.
 */
export function hiddenHeaderError(
  record: IntentRecord,
  response: { type: string | undefined; headers: Headers },
  problem: { type?: unknown } | undefined,
): CorsError | undefined {
  if (response.type !== 'cors' || typeof problem?.type !== 'string') return undefined
  if (!PACED_PROBLEMS.has(problem.type) || response.headers.has('retry-after')) return undefined
  return new CorsError({
    intentId: record.id,
    key: record.key,
    origin: new URL(record.url).origin,
    corsHeader: 'Access-Control-Expose-Headers',
    headers: ['Retry-After'],
  })
}
