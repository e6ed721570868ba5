import type { OncelyClient } from '@oncely/client'
import { createContext, useContext } from 'react'

/** The client of the nearest `OncelyProvider`. */
export const OncelyContext = createContext<OncelyClient | undefined>(undefined)

/**
 * The client passed as `client`, else the nearest {@link OncelyProvider}'s.
 *
 * @throws {TypeError} when there is neither.
 * @example
 * const client = useOncelyClient()
 */
export function useOncelyClient(client?: OncelyClient): OncelyClient {
  const provided = useContext(OncelyContext)
  if (client !== undefined) {
    assertClient(client, 'client')
    return client
  }
  if (!provided) {
    throw new TypeError(
      'No oncely client: render the component inside <OncelyProvider client={client}>, or pass the `client` option',
    )
  }
  return provided
}

/** Throws a TypeError naming `name` unless `value` looks like an {@link OncelyClient}. */
export function assertClient(value: unknown, name: string): asserts value is OncelyClient {
  const client = value as Partial<OncelyClient> | null | undefined
  if (
    typeof client?.request !== 'function' ||
    typeof client.mutation !== 'function' ||
    typeof client.on !== 'function' ||
    typeof client.pending !== 'function'
  ) {
    throw new TypeError(
      `Expected \`${name}\` to be an oncely client (from createClient), got ${String(value)}`,
    )
  }
}
