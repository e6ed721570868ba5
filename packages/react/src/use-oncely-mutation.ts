import type { OncelyClient, OncelyResponse } from '@oncely/client'
import { useMemo, useState, useSyncExternalStore } from 'react'
import { useOncelyClient } from './context.js'
import {
  checkMutationOptions,
  IntentMutation,
  type IntentMutationState,
  type MutateOptions,
  type MutationDefinition,
} from './intent-mutation.js'
import { useLatest } from './latest.js'

/** Options of {@link useOncelyMutation}: the endpoint, and how an intent is named. */
export interface UseOncelyMutationOptions<TVariables> extends MutationDefinition {
  /**
   * Names the intent from the variables (a business fact such as the cart being paid). A second `mutate` with the
   * same name while the first is pending (a double click, another tab) joins that intent instead of starting one;
   * after it settled, the stored outcome is returned (for the client's `settledTtlMs`). Without it, every `mutate`
   * is a new intent with a random key.
   * @default undefined
   * @example (order) => `checkout:${order.cartId}`
   */
  intentId?: (variables: TVariables) => string | undefined
  /**
   * The client to send with.
   * @default the nearest OncelyProvider's client
   * @example client: createClient({ baseUrl: 'https://api.example.com' })
   */
  client?: OncelyClient
}

/** What {@link useOncelyMutation} returns: the latest call's state and the functions to start or forget one. */
export type UseOncelyMutationResult<TData, TVariables> = IntentMutationState<TData, TVariables> & {
  /** Starts one intent with `variables` as its JSON body; the outcome lands in the state (never thrown). */
  mutate: (variables: TVariables, options?: MutateOptions) => void
  /** Like `mutate`, and resolves with the response or rejects with the error. */
  mutateAsync: (variables: TVariables, options?: MutateOptions) => Promise<OncelyResponse<TData>>
  /** Back to `idle`. A call still running goes on; its intent is not cancelled. */
  reset: () => void
}

/**
 * A mutation of one endpoint, for event handlers: each `mutate(variables)` is one intent, whose key is minted once,
 * written ahead and reused by every retry and resume. Rendering never mints a key or sends anything, so StrictMode
 * and concurrent rendering are safe; a call goes on after the component unmounts (its intent must not be lost).
 *
 * @example
 * const pay = useOncelyMutation<{ cartId: string; amount: number }, Payment>({
 *   path: '/v1/payments',
 *   intentId: (order) => `checkout:${order.cartId}`,
 * })
 * <button onClick={() => pay.mutate({ cartId, amount: 1250 })}>Pay</button>
 * {pay.status === 'pending' && `Attempt ${pay.attempts}…`}
 */
export function useOncelyMutation<TVariables = unknown, TData = unknown>(
  options: UseOncelyMutationOptions<TVariables>,
): UseOncelyMutationResult<TData, TVariables> {
  const client = useOncelyClient(options?.client)
  const resolved = { ...options, client }
  checkMutationOptions(resolved)
  const latest = useLatest(resolved)
  const [mutation] = useState(() => new IntentMutation<TVariables, TData>(() => latest.current))
  const state = useSyncExternalStore(mutation.subscribe, mutation.getState, mutation.getState)
  return useMemo(
    () => ({ ...state, mutate: mutation.mutate, mutateAsync: mutation.mutateAsync, reset: mutation.reset }),
    [state, mutation],
  )
}
