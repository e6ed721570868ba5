import type { OncelyClient, ResumedIntent } from '@oncely/client'
import { useEffect } from 'react'
import { useOncelyClient } from './context.js'
import { useLatest } from './latest.js'

/** Options of {@link useOnResumed}. */
export interface UseOnResumedOptions {
  /**
   * The client to listen to.
   * @default the nearest OncelyProvider's client
   * @example client: createClient({ baseUrl: 'https://api.example.com' })
   */
  client?: OncelyClient
}

/**
 * Calls `listener` for each intent that `resume()` settles or fails in this tab: after a reload (the provider's
 * resume on mount), on `online`, when the page becomes visible, or a direct call. Nobody awaits those runs, so this
 * is where their results reach the app, to update caches or show a toast. The latest `listener` is called; it is
 * subscribed from mount to unmount.
 *
 * @example
 * useOnResumed((intent) => {
 *   if (intent.outcome === 'settled') toast(`Payment ${intent.response.key} confirmed`)
 * })
 */
export function useOnResumed(
  listener: (intent: ResumedIntent) => void,
  options: UseOnResumedOptions = {},
): void {
  if (typeof listener !== 'function') {
    throw new TypeError(`Expected \`listener\` to be a function, got ${String(listener)}`)
  }
  const client = useOncelyClient(options.client)
  const latest = useLatest(listener)
  useEffect(() => client.on('resumed', (intent) => latest.current(intent)), [client, latest])
}
