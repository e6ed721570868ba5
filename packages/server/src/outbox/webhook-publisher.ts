import { nonEmptyString, objectOptions, positiveInteger } from '../options/check.js'
import { SIGNATURE_HEADER, signPayload } from '../webhooks/signature.js'
import type { OutboxMessage, Publisher } from './types.js'

/** Options of {@link webhookPublisher}. */
export interface WebhookPublisherOptions {
  /** The receiver's URL, or a function choosing it per message (by `topic`, say). */
  url: string | ((message: OutboxMessage) => string)
  /** The shared secret the receiver verifies with `verifySignature`. */
  secret: string
  /**
   * Time allowed for the receiver's answer; a timeout is a failed attempt (retried, the receiver dedupes on the id).
   * @default 10_000
   */
  timeoutMs?: number
  /** @default globalThis.fetch */
  fetch?: typeof fetch
}

/**
 * Publishes each message as a signed JSON POST: body `{ id, topic, payload }`, header `webhook-id` (the outbox id,
 * stable across retries, for the receiver's dedupe) and `oncely-signature: t=…,v1=…`. Any 2xx is a delivery;
 * anything else, or no answer, is a failed attempt.
 *
 * @example
 * createDispatcher({ pool, publisher: webhookPublisher({ url: 'https://partner.example/hooks', secret }) })
 */
export function webhookPublisher(options: WebhookPublisherOptions): Publisher {
  objectOptions('webhookPublisher()', options)
  const { url } = options
  if (typeof url !== 'function' && !URL.canParse(String(url))) {
    throw new TypeError(`Expected \`url\` to be an absolute URL or a function, got ${String(url)}.`)
  }
  const secret = nonEmptyString('secret', options.secret)
  const timeoutMs = positiveInteger('timeoutMs', options.timeoutMs ?? 10_000)
  const doFetch = options.fetch ?? ((...args: Parameters<typeof fetch>) => globalThis.fetch(...args))
  return {
    async publish(message) {
      const body = JSON.stringify({ id: message.id, topic: message.topic, payload: message.payload })
      const target = typeof url === 'function' ? url(message) : url
      const response = await doFetch(target, {
        method: 'POST',
        body,
        signal: AbortSignal.timeout(timeoutMs),
        headers: {
          ...message.headers,
          'content-type': 'application/json',
          'webhook-id': message.id,
          [SIGNATURE_HEADER]: signPayload(body, { secret }),
        },
      })
      await response.body?.cancel().catch(() => {})
      if (!response.ok) throw new Error(`The webhook receiver answered ${response.status}.`)
    },
  }
}
