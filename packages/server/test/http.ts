import { sleep } from './helpers.js'

export interface HttpResult {
  status: number
  headers: Headers
  body: Buffer
}

/** One POST over a real socket. Network errors resolve as status 0 (the client saw no response). */
export async function postPayment(
  baseUrl: string,
  key: string,
  body: unknown,
  tenant = 'tenant_1',
): Promise<HttpResult> {
  try {
    const response = await fetch(`${baseUrl}/v1/payments`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${tenant}`,
        'content-type': 'application/json',
        'idempotency-key': key,
      },
      body: JSON.stringify(body),
    })
    return {
      status: response.status,
      headers: response.headers,
      body: Buffer.from(await response.arrayBuffer()),
    }
  } catch {
    return { status: 0, headers: new Headers(), body: Buffer.alloc(0) }
  }
}

/** Retries like a client would (on no response, 409, 5xx) until a final answer or the deadline. */
export async function retryUntilFinal(
  send: () => Promise<HttpResult>,
  deadlineMs = 10_000,
): Promise<HttpResult> {
  const until = Date.now() + deadlineMs
  for (;;) {
    const result = await send()
    const retryable = result.status === 0 || result.status === 409 || result.status >= 500
    if (!retryable || Date.now() > until) return result
    await sleep(50)
  }
}
