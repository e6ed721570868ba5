import { decodeBody } from './body.js'
import { isFetchNetworkError } from './classify.js'
import { NetworkError } from './errors/network-error.js'
import type { IntentRecord } from './intent.js'
import type { Timers } from './timers.js'

/** A response read to the end (a connection dropped mid-body is a network error, retried like any other). */
export interface RawResponse {
  status: number
  headers: Headers
  text: string
  /** The Fetch API's response type: `'cors'` for a cross-origin answer in a browser, whose headers CORS filters. */
  type: string | undefined
}

/**
 * Sends one attempt with `fetch`. The client owns the only retry loop and classifies every status itself, so this
 * never retries and never throws for an HTTP status. Throws {@link NetworkError} when no response arrived (including
 * `timeoutMs`); rethrows anything else (the caller's abort, a malformed header) unchanged.
 *
 * Plain `fetch` rather than ky: with ky's retry and HTTP errors off, what remained of it was the timeout, and its
 * 5 KB (gzipped) did not fit the 12 KB budget of the browser entry.
 */
export async function sendAttempt(
  record: IntentRecord,
  headers: Record<string, string>,
  options: {
    fetch: typeof fetch | undefined
    timeoutMs: number | false
    signal: AbortSignal | undefined
    timers: Timers
  },
): Promise<RawResponse> {
  const { signal, timers, timeoutMs } = options
  const controller = new AbortController()
  const onAbort = () => controller.abort(signal?.reason)
  signal?.addEventListener('abort', onAbort, { once: true })
  let timedOut = false
  const timer =
    timeoutMs === false
      ? undefined
      : timers.setTimeout(() => {
          timedOut = true
          controller.abort(new Error(`No response within timeoutMs (${timeoutMs} ms)`))
        }, timeoutMs)
  try {
    if (signal?.aborted) throw signal.reason
    const send = options.fetch ?? globalThis.fetch
    const response = await send(record.url, {
      method: record.method,
      headers,
      body: decodeBody(record.body) as BodyInit | undefined,
      signal: controller.signal,
    })
    return {
      status: response.status,
      headers: response.headers,
      text: await response.text(),
      type: response.type,
    }
  } catch (error) {
    if (signal?.aborted) throw signal.reason
    if (timedOut) throw new NetworkError(controller.signal.reason, true)
    if (isFetchNetworkError(error)) throw new NetworkError(error, false)
    throw error
  } finally {
    if (timer !== undefined) timers.clearTimeout(timer)
    signal?.removeEventListener('abort', onAbort)
  }
}
