import type { OncelyClient } from '@oncely/client'
import { createElement, type ReactNode, useEffect } from 'react'
import { assertClient, OncelyContext } from './context.js'
import { retainIntentSync } from './pending-intents.js'

/** Props of {@link OncelyProvider}. */
export interface OncelyProviderProps {
  /**
   * The client every hook below uses unless it is given its own `client` option.
   * @example createClient({ baseUrl: 'https://api.example.com', store: indexedDbStore() })
   */
  client: OncelyClient
  /**
   * Calls `client.resume()` once the tree has mounted, to finish intents a reload, a crash or a closed tab left
   * pending. It runs after the effects of every component below, so each `useOnResumed` listener is already
   * subscribed when the first outcome arrives (which `createClient({ resumeOnStart: true })` cannot promise).
   * StrictMode's second mount joins the same run.
   * @default true
   * @example resumeOnMount={false} // resume yourself, for example after sign-in
   */
  resumeOnMount?: boolean
  /** The app. */
  children?: ReactNode
}

/**
 * Gives the hooks below it a client, resumes what earlier pages left pending, and tells this origin's other tabs
 * when this tab's intents change (so their {@link usePendingIntents} views refresh).
 *
 * @example
 * const client = createClient({ baseUrl: 'https://api.example.com' })
 * root.render(<OncelyProvider client={client}><App /></OncelyProvider>)
 */
export function OncelyProvider({ client, resumeOnMount = true, children }: OncelyProviderProps) {
  assertClient(client, 'client')
  if (typeof resumeOnMount !== 'boolean') {
    throw new TypeError(`Expected \`resumeOnMount\` to be a boolean, got ${String(resumeOnMount)}`)
  }
  useEffect(() => retainIntentSync(client), [client])
  useEffect(() => {
    if (resumeOnMount) void client.resume().catch(() => {})
  }, [client, resumeOnMount])
  return createElement(OncelyContext.Provider, { value: client }, children)
}
