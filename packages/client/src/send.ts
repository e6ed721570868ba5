import ky from 'ky'
import { decodeBody } from './body.js'
import { isFetchNetworkError, isTimeout } from './classify.js'
import { NetworkError } from './errors/network-error.js'
import type { IntentRecord } from './intent.js'

/** A response read to the end (a connection dropped mid-body is a network error, retried like any other). */
export interface RawResponse {
  status: number
  headers: Headers
  text: string
}

/**
 * Sends one attempt through ky with its own retry turned off (the client owns the only retry loop) and HTTP errors
 * returned rather than thrown, so the client classifies every status itself. Throws {@link NetworkError} when no
 * response arrived; rethrows anything else (an abort, a malformed header) unchanged.
 */
export async function sendAttempt(
  record: IntentRecord,
  headers: Record<string, string>,
  options: { fetch: typeof fetch | undefined; timeoutMs: number | false; signal: AbortSignal | undefined },
): Promise<RawResponse> {
  try {
    const response = await ky(record.url, {
      method: record.method,
      body: decodeBody(record.body) as BodyInit | undefined,
      headers,
      retry: 0,
      throwHttpErrors: false,
      timeout: options.timeoutMs,
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.fetch ? { fetch: options.fetch } : {}),
    })
    return { status: response.status, headers: response.headers, text: await response.text() }
  } catch (error) {
    if (options.signal?.aborted) throw options.signal.reason
    if (isTimeout(error)) throw new NetworkError(error, true)
    if (isFetchNetworkError(error)) throw new NetworkError(error, false)
    throw error
  }
}
