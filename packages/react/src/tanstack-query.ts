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
  /**
   * Sends the variables as the JSON body of one intent. Called again by TanStack Query for each retry that oncely
   * makes (see `retry`), it joins the same run: it never sends another request, nor mints another key.
   */
  mutationFn: (variables: TVariables, context?: object) => Promise<OncelyResponse<TData>>
  /**
   * oncely's client owns the retries (one loop, Retry-After, the same key and bytes); this only lets TanStack
   * Query count them. Each retry oncely schedules is reported to TanStack Query as a failed attempt, so
   * `failureCount` counts the failed attempts and `failureReason` is the last attempt's error (an `HTTPError` with
   * its `status`, or a `NetworkError`) while the mutation is pending; the call TanStack Query then makes continues
   * the same run. Any other error is final.
   */
  retry: (failureCount: number, error: Error) => boolean
  /** 0: the wait before the next attempt is oncely's (Retry-After, backoff), already under way. */
  retryDelay: 0
  /**
   * `'always'`: the intent is written ahead at once even offline, where TanStack Query's default would hold the
   * call until online, and a reload meanwhile would lose the click. The client retries until the network is back.
   */
  networkMode: 'always'
}

/**
 * One `mutate` of a TanStack mutation: the intent's run, and the retries it made that TanStack Query has not been
 * told of yet. TanStack Query calls `mutationFn` once per attempt it counts, always with the same context object.
 */
class Run<TData> {
  readonly #retries: Error[] = []
  #outcome: { ok: true; value: OncelyResponse<TData> } | { ok: false; error: unknown } | undefined
  #wake: (() => void) | undefined

  constructor(
    client: OncelyClient,
    start: (onIntent: (intent: { id: string }) => void) => Promise<OncelyResponse<TData>>,
  ) {
    let id: string | undefined
    const off = client.on('retry', (event) => {
      if (event.id !== id) return
      this.#retries.push(event.error)
      this.#wake?.()
    })
    start((intent) => {
      id = intent.id
    })
      .then(
        (value) => {
          this.#outcome = { ok: true, value }
        },
        (error: unknown) => {
          this.#outcome = { ok: false, error }
        },
      )
      .finally(() => {
        off()
        this.#wake?.()
      })
  }

  /** The next thing to tell TanStack Query: a retry (thrown as its attempt's error), or the outcome. */
  async next(): Promise<OncelyResponse<TData>> {
    for (;;) {
      const retry = this.#retries.shift()
      if (retry) {
        RETRIES.add(retry)
        throw retry
      }
      if (this.#outcome) {
        if (this.#outcome.ok) return this.#outcome.value
        throw this.#outcome.error
      }
      await new Promise<void>((resolve) => {
        this.#wake = resolve
      })
      this.#wake = undefined
    }
  }
}

// Errors handed to TanStack Query as "this attempt failed, oncely retries": the only ones its retry goes on for.
const RETRIES = new WeakSet<object>()

// The run of each `mutate`, by TanStack Query's context object (one per `mutate`; TanStack Query 5.80 and later
// pass it). Module-wide, not per options object: `useMutation` takes the options of every render, and a retry
// calls the latest render's `mutationFn`.
const RUNS = new WeakMap<object, Run<unknown>>()

/**
 * Options for TanStack Query v5's `useMutation` that send through oncely: one intent per `mutate`, the key stable
 * across every retry and resume, retries left to oncely and counted in the mutation's `failureCount` and
 * `failureReason`. Spread them first and add your own callbacks; do not set `retry` or `retryDelay` again. Pair it
 * with {@link useResumedMutations} (or {@link useInvalidateOnResumed}) so intents finished after a reload reach
 * the mutation cache and refresh the queries they affect.
 *
 * @example
 * const pay = useMutation({
 *   ...oncelyMutationOptions<Order, Payment>({ client, path: '/v1/payments', intentId: (o) => `checkout:${o.cartId}` }),
 *   onSuccess: () => queryClient.invalidateQueries({ queryKey: ['payments'] }),
 * })
 * // pay.failureCount: attempts that failed so far; pay.failureReason: the last one's error
 */
export function oncelyMutationOptions<TVariables = unknown, TData = unknown>(
  options: OncelyMutationOptionsInput<TVariables>,
): OncelyMutationOptions<TData, TVariables> {
  checkMutationOptions(options)
  const { client, intentId, ...definition } = options
  const send = client.mutation<TVariables, TData>(definition)
  return {
    mutationFn: (variables, context) => {
      const start = (onIntent?: (intent: { id: string }) => void) =>
        send(variables, { intentId: intentId?.(variables), ...(onIntent ? { onIntent } : {}) })
      if (typeof context !== 'object' || context === null) return start()
      let run = RUNS.get(context) as Run<TData> | undefined
      if (!run) {
        run = new Run(client, start)
        RUNS.set(context, run as Run<unknown>)
      }
      return run.next()
    },
    retry: (_failureCount, error) => typeof error === 'object' && error !== null && RETRIES.has(error),
    retryDelay: 0,
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
  checkHookArguments(queryClient, 'invalidateQueries', 'queryKeys', queryKeys)
  useOnResumed((intent) => {
    if (intent.outcome !== 'settled') return
    for (const queryKey of queryKeys(intent)) void queryClient.invalidateQueries({ queryKey })
  }, options)
}

/** The part of TanStack Query's `QueryClient` that {@link useResumedMutations} uses. */
export interface ResumingQueryClient {
  getMutationCache(): {
    build(
      client: never,
      options: {
        mutationKey?: readonly unknown[]
        mutationFn: () => Promise<unknown>
        retry: 0
        networkMode: 'always'
        meta: Record<string, unknown>
      },
    ): { execute(variables: undefined): Promise<unknown> }
  }
}

/**
 * Puts each intent that `resume()` settles or fails (after a reload, on `online`, ...) into TanStack Query's
 * mutation cache, as a mutation that ran to that outcome: `useMutationState` and `useIsMutating` see it, and the
 * `MutationCache`'s own `onSuccess`, `onError` and `onSettled` run for it, like for any mutation of the app. No
 * `useMutation` of the page that called `mutate` is left to hear it. `mutationKey` maps the resumed intent (its
 * `method`, `url`, `id` and outcome) to the key of the mutation it belongs to, or `undefined` to leave it out. The
 * mutation's `meta.oncely` is the resumed intent; its `data` is the response, as `useMutation`'s is.
 *
 * @example
 * const queryClient = useQueryClient()
 * useResumedMutations(queryClient, (intent) => (new URL(intent.url).pathname === '/v1/payments' ? ['pay'] : undefined))
 * const payments = useMutationState({ filters: { mutationKey: ['pay'] }, select: (m) => m.state.data })
 */
export function useResumedMutations(
  queryClient: ResumingQueryClient,
  mutationKey: (intent: ResumedIntent) => readonly unknown[] | undefined,
  options: UseOnResumedOptions = {},
): void {
  checkHookArguments(queryClient, 'getMutationCache', 'mutationKey', mutationKey)
  useOnResumed((intent) => {
    const key = mutationKey(intent)
    if (key === undefined) return
    const mutation = queryClient.getMutationCache().build(queryClient as never, {
      mutationKey: key,
      mutationFn: () =>
        intent.outcome === 'settled' ? Promise.resolve(intent.response) : Promise.reject(intent.error),
      retry: 0,
      networkMode: 'always',
      meta: { oncely: intent },
    })
    mutation.execute(undefined).catch(() => {}) // a failed one is in the cache as failed; nobody awaits it
  }, options)
}

// Checks the arguments of a hook over a TanStack Query QueryClient: it has `method`, and the option `name` is a
// function.
function checkHookArguments(queryClient: unknown, method: string, name: string, value: unknown): void {
  if (typeof (queryClient as Record<string, unknown> | null | undefined)?.[method] !== 'function') {
    throw new TypeError('Expected `queryClient` to be a TanStack Query QueryClient')
  }
  if (typeof value !== 'function') throw new TypeError(`Expected \`${name}\` to be a function`)
}
