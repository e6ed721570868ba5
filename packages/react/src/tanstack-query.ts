import type { OncelyClient, OncelyResponse, ResumedIntent } from '@oncely/client'
import { checkMutationOptions, type MutationDefinition } from './intent-mutation.js'
import { type UseOnResumedOptions, useOnResumed } from './use-on-resumed.js'

/** Options of {@link oncelyMutationOptions}. */
export interface OncelyMutationOptionsInput<TVariables> extends MutationDefinition {
  /**
   * The client to send with (in a component: `useOncelyClient()`).
   * @example createClient({ baseUrl: 'https://api.example.com' })
   */
  client: OncelyClient
  /**
   * Names the intent from the variables, so a second `mutate` for the same fact joins it (see `useOncelyMutation`).
   * @default undefined: every `mutate` is a new intent with a random key
   * @example (order) => `checkout:${order.cartId}`
   */
  intentId?: (variables: TVariables) => string | undefined
}

/** The part of TanStack Query's `useMutation` options that {@link oncelyMutationOptions} decides. */
export interface OncelyMutationOptions<TData, TVariables> {
  /** Sends the variables as the JSON body of one intent. */
  mutationFn: (variables: TVariables) => Promise<OncelyResponse<TData>>
  /**
   * 0: oncely's client owns the retries (one loop, Retry-After, the same key and bytes). TanStack Query's retry
   * would call `mutationFn` again, and a second call without `intentId` is a second intent with a new key.
   */
  retry: 0
  /**
   * `'always'`: the intent is written ahead at once even offline, where TanStack Query's default would hold the
   * call until online, and a reload meanwhile would lose the click. The client retries until the network is back.
   */
  networkMode: 'always'
}

/**
 * Options for TanStack Query v5's `useMutation` that send through oncely: one intent per `mutate`, the key stable
 * across every retry and resume, retries left to oncely. Spread them first and add your own callbacks; do not set
 * `retry` again. Pair it with {@link useInvalidateOnResumed} so intents finished after a reload refresh the queries
 * they affect.
 *
 * @example
 * const pay = useMutation({
 *   ...oncelyMutationOptions<Order, Payment>({ client, path: '/v1/payments', intentId: (o) => `checkout:${o.cartId}` }),
 *   onSuccess: () => queryClient.invalidateQueries({ queryKey: ['payments'] }),
 * })
 */
export function oncelyMutationOptions<TVariables = unknown, TData = unknown>(
  options: OncelyMutationOptionsInput<TVariables>,
): OncelyMutationOptions<TData, TVariables> {
  checkMutationOptions(options)
  const { client, intentId, ...definition } = options
  const send = client.mutation<TVariables, TData>(definition)
  return {
    mutationFn: (variables) => send(variables, { intentId: intentId?.(variables) }),
    retry: 0,
    networkMode: 'always',
  }
}

/** The part of TanStack Query's `QueryClient` that {@link useInvalidateOnResumed} uses. */
export interface InvalidatingQueryClient {
  invalidateQueries(filters: { queryKey: readonly unknown[] }): Promise<unknown>
}

/**
 * Invalidates the queries an intent affects when `resume()` settles it (after a reload, on `online`, ...), which no
 * `useMutation` callback sees: the page that called `mutate` may be gone. `queryKeys` maps the resumed intent (its
 * `method`, `url`, `id` and response) to the query keys to invalidate.
 *
 * @example
 * const queryClient = useQueryClient()
 * useInvalidateOnResumed(queryClient, (intent) =>
 *   new URL(intent.url).pathname === '/v1/payments' ? [['payments']] : [],
 * )
 */
export function useInvalidateOnResumed(
  queryClient: InvalidatingQueryClient,
  queryKeys: (intent: ResumedIntent) => readonly (readonly unknown[])[],
  options: UseOnResumedOptions = {},
): void {
  if (typeof queryClient?.invalidateQueries !== 'function') {
    throw new TypeError('Expected `queryClient` to be a TanStack Query QueryClient')
  }
  if (typeof queryKeys !== 'function') throw new TypeError('Expected `queryKeys` to be a function')
  useOnResumed((intent) => {
    if (intent.outcome !== 'settled') return
    for (const queryKey of queryKeys(intent)) void queryClient.invalidateQueries({ queryKey })
  }, options)
}
