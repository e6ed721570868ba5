import { createClientWith } from './client.js'
import type { createClient as nodeCreateClient } from './create-client.js'
import { defaultStore } from './stores/default.browser.js'

/**
 * Creates a client; in browsers its store defaults to `indexedDbStore()`. See `createClient` of the package's
 * main entry for the rest.
 *
 * @example
 * const client = createClient({ baseUrl: 'https://api.example.com' })
 */
export const createClient: typeof nodeCreateClient = (options) => createClientWith(options, defaultStore)
