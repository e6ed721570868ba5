import { createClientWith, type OncelyClient } from './client.js'
import type { ClientOptions } from './options.js'
import { defaultStore } from './stores/default.js'

/**
 * Creates a client. Nothing touches the network, storage or browser globals until it is used. Options are
 * validated at once: a `TypeError` names every bad option.
 *
 * @example
 * const client = createClient({
 *   baseUrl: 'https://api.example.com',
 *   store: fileStore({ dir: '.oncely' }),
 *   headers: async () => ({ authorization: `Bearer ${await getToken()}` }),
 * })
 * const res = await client.request({ path: '/v1/payments', json: { amount: 100 }, intentId: 'checkout:cart_42' })
 */
export function createClient(options: ClientOptions): OncelyClient {
  return createClientWith(options, defaultStore)
}
