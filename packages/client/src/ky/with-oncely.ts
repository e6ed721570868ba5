import type { BeforeRequestHook, KyInstance, Options, RetryOptions } from 'ky'
import type { OncelyClient } from '../client.js'
import { OptionChecks } from '../validate.js'
import { type Marking, markingOf, sendIntent } from './request.js'

/** Options of {@link withOncely}. */
export interface WithOncelyOptions {
  /**
   * The oncely client whose store, retry loop and `fetch` carry the intents. Required.
   * @default none: required
   * @example createClient({ baseUrl: 'https://api.example.com', store: fileStore({ dir: '.oncely' }) })
   */
  client: OncelyClient
  /**
   * The methods whose requests are intents. A request's `oncely` option overrides this either way: `oncely: false`
   * sends an unsafe request as plain ky would, `oncely: true` (or `{ intentId }`) makes any request an intent.
   * @default ['POST', 'PUT', 'PATCH', 'DELETE']
   * @example ['POST']
   */
  methods?: readonly string[]
}

// ky 1.14's default `retry.methods`, the list an instance without its own retries.
const KY_RETRY_METHODS = ['get', 'put', 'head', 'delete', 'options', 'trace']

/**
 * A ky instance whose unsafe requests (POST, PUT, PATCH and DELETE by default) are oncely intents of `client`: the
 * idempotency key is minted once, the intent (method, URL, headers, the exact body bytes) is written to the client's
 * store before the first byte, the client's one retry loop sends it (honouring `Retry-After` on 409, 429 and 503,
 * never retrying a 422), and after a crash `client.resume()` finishes it with the same key and bytes. Other
 * requests go on as plain ky, with the instance's own `fetch`, retries and hooks.
 *
 * ky's own retry never runs on top of oncely's for an intent: the instance's `retry.methods` lose the intent
 * methods, and an intent whose request would let ky retry it anyway (its own `retry` option, an `afterResponse`
 * hook's `ky.retry()`) or that brings its own `fetch` is refused with a `TypeError` naming the fix, before
 * anything is written or sent. ky's `timeout` (10 s by default) bounds the whole run of an intent, retries and
 * waits included; when it fires the intent stays pending, for `client.resume()`.
 *
 * @example
 * const api = withOncely(ky.create({ prefixUrl: 'https://api.example.com' }), { client })
 * const payment = await api.post('v1/payments', { json: { amount: 100 }, oncely: { intentId: 'checkout:cart_42' } }).json()
 */
export function withOncely(instance: KyInstance, options: WithOncelyOptions): KyInstance {
  if (typeof instance !== 'function' || typeof instance?.extend !== 'function') {
    throw new TypeError('withOncely: Expected `instance` to be a ky instance (ky, or ky.create(...))')
  }
  const checks = new OptionChecks('withOncely', options)
  const client = options.client
  if (typeof client?.request !== 'function') {
    checks.problem('Expected `client` to be an oncely client (what createClient returns)')
  }
  const methods = options.methods ?? ['POST', 'PUT', 'PATCH', 'DELETE']
  if (!Array.isArray(methods) || !methods.every((m) => typeof m === 'string' && /^[A-Za-z]+$/.test(m))) {
    checks.problem(`Expected \`methods\` to be an array of HTTP method names, got ${String(methods)}`)
  }
  checks.done()
  const intentMethods = new Set(methods.map((m) => m.toUpperCase()))
  const isIntent = (method: string, marking: Marking) =>
    marking === false ? false : marking !== undefined || intentMethods.has(method.toUpperCase())

  let defaults: Options = {}
  // `retry: undefined` first: ky merges arrays by concatenation, so new `retry.methods` could not replace old ones.
  const cleared = instance.extend((current) => {
    defaults = current
    return { retry: undefined }
  })
  const base = defaults.fetch
  const oncelyFetch = async (input: RequestInfo | URL, init?: RequestInit & { oncely?: unknown }) => {
    const request = input instanceof Request ? input : new Request(input, init)
    const marking = markingOf(init?.oncely)
    if (!isIntent(request.method, marking)) return base ? base(input, init) : globalThis.fetch(input, init)
    return sendIntent(client, request, marking || {})
  }
  // Every request passes here first, with the options ky will use for it: an intent that ky could send twice, or
  // past oncely, is refused before anything is written or sent.
  const guard: BeforeRequestHook = (request, normalized, { retryCount }) => {
    const method = request.method.toUpperCase()
    // ky hands its hooks every option of the request, its own `fetch` and ours (`oncely`) included.
    const own = normalized as typeof normalized & { oncely?: unknown; fetch?: unknown }
    const marking = markingOf(own.oncely)
    if (!isIntent(method, marking)) return
    if (own.fetch !== oncelyFetch) {
      throw new TypeError(
        `withOncely: this ${method} request's own \`fetch\` option would send it past oncely, without its key or write-ahead; remove it (intents are sent with createClient's \`fetch\`)`,
      )
    }
    // Before the retryCount check: ky retries a refused request of a method it retries, and this message must win.
    const retry = normalized.retry as Required<RetryOptions>
    if (retry.limit > 0 && retry.methods.some((m) => m.toUpperCase() === method)) {
      const name = method.toLowerCase()
      throw new TypeError(
        `withOncely: ky would retry this ${method} intent on top of oncely's retry loop (its \`retry.methods\` include '${name}'); pass \`retry: 0\` with the request, or leave '${name}' out of \`retry.methods\` (oncely retries intents itself: createClient's \`retry\`)`,
      )
    }
    if (retryCount > 0) {
      throw new TypeError(
        `withOncely: ky was about to send this ${method} request again (an \`afterResponse\` hook's ky.retry()), which would be a second intent under a new key; oncely retries intents itself (createClient's \`retry\`): return a response from the hook instead`,
      )
    }
  }
  return cleared.extend({
    retry: withoutIntents(defaults.retry, intentMethods),
    fetch: oncelyFetch as typeof fetch,
    hooks: { beforeRequest: [guard] },
  })
}

// The instance's retry options, with the intent methods taken out of `retry.methods`.
function withoutIntents(retry: Options['retry'], intentMethods: Set<string>): RetryOptions {
  const own: RetryOptions = typeof retry === 'number' ? { limit: retry } : { ...retry }
  const methods = (own.methods ?? KY_RETRY_METHODS).filter((m) => !intentMethods.has(m.toUpperCase()))
  return { ...own, methods }
}
