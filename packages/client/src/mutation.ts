import type { OncelyClient } from './client.js'
import type { RequestOptions } from './request.js'

/**
 * `client.mutation` over `send`, a client's `request`: each call sends the definition's options, then the call's
 * (their headers merged), with `json` as the body.
 */
export function mutationOf(send: (options: RequestOptions) => Promise<unknown>): OncelyClient['mutation'] {
  return (definition) => (json, extra) =>
    send({ ...definition, ...extra, json, headers: { ...definition.headers, ...extra?.headers } }) as never
}
