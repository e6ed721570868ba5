import { optionName } from '../options/check.js'
import { misconfiguredAnswer, problemAnswer, type ReplacingAnswer } from './answer.js'
import type { AdapterLogger } from './options.js'
import { type HeaderReader, headerProblem, isSafeMethod, parseBody } from './request.js'

/**
 * What every adapter does with a request before the engine sees it, in one place, so that the adapters agree:
 *
 * - Safe methods (GET, HEAD, OPTIONS) are never idempotency-checked, and an idempotent handler never runs on one
 *   unguarded. Where the framework names a route's methods when it is registered (Fastify), registering fails with
 *   {@link checkRouteMethods}'s TypeError; where only a request shows the method (a wrapped handler or a
 *   middleware: Express, Koa, the Fetch API), the request gets {@link RequestPolicy.safeMethod}'s 500 without
 *   running the handler, and the log says once per route how to fix it.
 * - A body is refused the same way everywhere: from its headers alone, before a byte is read (415 not JSON, 413 a
 *   `Content-Length` over the limit: {@link earlyRefusal}), then while it is read (413 past the limit), both sent
 *   with `refuse` so the answer reaches a client still sending; then once read (400 `invalid_json`, by
 *   {@link parseBody}); and a body another parser already read, whose bytes can no longer be checked or
 *   fingerprinted, is {@link RequestPolicy.bodyConsumed}'s 500, logged once per route.
 * - Mistakes in the server's setup are a 500 problem+json that tells the client only that it is the server's fault;
 *   the cause and its fix go to the log once per route, never once per request.
 */

/** The answer to a request refused from its headers alone, before its body is read (see `headerProblem`). */
export function earlyRefusal(header: HeaderReader, maxBodyBytes: number): ReplacingAnswer | undefined {
  const details = headerProblem(header, maxBodyBytes)
  return details && problemAnswer(details)
}

/** The parsed body of bytes read in full, or the 400 that refuses them (see `parseBody`). */
export function bodyOf(
  bytes: Uint8Array,
  header: HeaderReader,
): { ok: true; body: unknown } | { ok: false; answer: ReplacingAnswer } {
  const parsed = parseBody(bytes, header)
  return parsed.ok ? parsed : { ok: false, answer: problemAnswer(parsed.problem) }
}

const safeMethodMessage = (methods: string, where: string) =>
  `safe methods are never idempotency-checked, so an idempotent handler must not answer ${methods} (route ${where}). Use it on POST, PUT, PATCH or DELETE routes only; split a route that also answers ${methods}.`

/**
 * For adapters that see a route's methods when it is registered: throws a TypeError when any is safe, naming the
 * route and the option that made it idempotent.
 */
export function checkRouteMethods(methods: readonly string[], where: string, option: string): void {
  const safe = methods.map((method) => method.toUpperCase()).filter(isSafeMethod)
  if (safe.length > 0) {
    throw new TypeError(
      `Expected ${optionName(option)} only on unsafe methods: ${safeMethodMessage(safe.join(', '), where)}`,
    )
  }
}

/** The policy's answers that depend on the request, with the once-per-route log; one per adapter instance. */
export interface RequestPolicy {
  /**
   * The answer to a safe method on an idempotent handler (the handler does not run): 500 problem+json, and the log
   * says once per route how to fix it. `where` names the route, such as `GET /v1/orders`.
   */
  safeMethod(method: string, where: string, log: AdapterLogger): ReplacingAnswer
  /**
   * The answer to a request whose body another parser read before the adapter could: 500 problem+json, logged once
   * per route with `fix`, which says how to mount that parser instead.
   */
  bodyConsumed(where: string, fix: string, log: AdapterLogger): ReplacingAnswer
  /** The answer to an idempotent handler used where it cannot name its operation (`message` says the fix). */
  misplaced(where: string, message: string, log: AdapterLogger): ReplacingAnswer
}

/** One answer for every mistake in how the routes are set up; the log has the cause. */
const notSetUp = (): ReplacingAnswer => misconfiguredAnswer('This route is not set up correctly.')

export function createRequestPolicy(adapter: string): RequestPolicy {
  const reported = new Set<string>()
  const once = (what: string, log: AdapterLogger, message: string) => {
    if (reported.has(what)) return
    reported.add(what)
    log.error({}, message)
  }
  return {
    safeMethod(method, where, log) {
      once(
        `safe ${where}`,
        log,
        `oncely: ${adapter} refused a ${method} request: ${safeMethodMessage(method, where)}`,
      )
      return notSetUp()
    },
    bodyConsumed(where, fix, log) {
      once(
        `consumed ${where}`,
        log,
        `oncely: the body of ${where} was read by another body parser before ${adapter} could parse it, so its duplicate member names, integers beyond 2^53 and bytes that are not UTF-8 would pass unchecked and its fingerprint would not be the request's; every such request is refused. ${fix}`,
      )
      return notSetUp()
    },
    misplaced(where, message, log) {
      once(`misplaced ${where}`, log, `oncely: ${message}`)
      return notSetUp()
    },
  }
}
