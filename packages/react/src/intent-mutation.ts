import type { OncelyClient, OncelyResponse, RequestOptions } from '@oncely/client'
import { assertClient } from './context.js'

/** The endpoint a mutation calls: everything of `client.request` but the body and what is per call. */
export type MutationDefinition = Omit<RequestOptions, 'json' | 'body' | 'intentId' | 'signal' | 'onIntent'>

/** What a mutation needs besides its variables; read again at every `mutate`. */
export interface IntentMutationOptions<TVariables> extends MutationDefinition {
  client: OncelyClient
  intentId?: ((variables: TVariables) => string | undefined) | undefined
}

/** Options of one `mutate` or `mutateAsync` call. */
export interface MutateOptions {
  /**
   * Cancels the waits and the attempt in flight; the intent stays pending for `resume()` (`resumable: true`).
   * @default undefined: the call runs until the intent settles, fails or exhausts its retries
   * @example signal: AbortSignal.timeout(10_000)
   */
  signal?: AbortSignal
}

/**
 * The state of a mutation's latest call, for a UI to render. Each `mutate` is one intent; a call replaced by a newer
 * one (or by `reset`) no longer changes it.
 */
export type IntentMutationState<TData = unknown, TVariables = unknown> =
  | {
      /** Nothing called yet, or `reset()`. */
      status: 'idle'
      variables: undefined
      intentId: undefined
      key: undefined
      attempts: 0
    }
  | {
      /** The intent is being written ahead, sent, retried, or waited for while another tab drives it. */
      status: 'pending'
      /** The variables (the JSON body) of this call. */
      variables: TVariables
      /** The intent's id (its `intentId`, or its key for a one-off intent), once minted. */
      intentId: string | undefined
      /** The `Idempotency-Key` every attempt carries, once minted. */
      key: string | undefined
      /** Attempts sent so far, over every run, tab and process (the `Oncely-Attempt` header); 0 before the first. */
      attempts: number
      /** When the next attempt is due (ms since the epoch, by `Date.now()`) while waiting to retry, else `undefined`. */
      nextRetryAt: number | undefined
      /** Why the last attempt is retried, such as `status 503` or `network`, while waiting to retry. */
      retryReason: string | undefined
    }
  | {
      /** The server answered 2xx or 3xx. */
      status: 'settled'
      variables: TVariables
      intentId: string
      key: string
      attempts: number
      /** The response: `status`, `headers`, `data`, `key`, `replayed`, `attempts`. */
      response: OncelyResponse<TData>
      /** `response.data`. */
      data: TData
      /**
       * Where the answer came from: `true` when the server replayed its stored response (an earlier attempt, tab or
       * page already did the work), `false` when this attempt did it.
       */
      replayed: boolean
    }
  | {
      /** The call ended with an error. */
      status: 'failed'
      variables: TVariables
      intentId: string | undefined
      key: string | undefined
      attempts: number
      /**
       * The error: `HTTPError` (a final status, with `status` and `problem`), `IdempotencyKeyReusedError`,
       * `RetryExhaustedError`, `IntentExpiredError`, `StorageError`, or the signal's reason. Tell them apart with
       * the guards of `@oncely/client` (`isHTTPError(error)`, ...).
       */
      error: Error
      /**
       * True when the intent is still pending in the store (retries exhausted, or cancelled by the signal):
       * `resume()` sends it again with the same key and bytes, and `useOnResumed` hears the outcome.
       */
      resumable: boolean
    }

const IDLE = Object.freeze({
  status: 'idle',
  variables: undefined,
  intentId: undefined,
  key: undefined,
  attempts: 0,
}) as IntentMutationState<never, never>

/**
 * One mutation's state machine, outside React: `mutateAsync` runs one intent through `client.mutation(...)` and
 * follows its events by id; `subscribe` and `getState` fit `useSyncExternalStore`. Creating it has no effect.
 */
export class IntentMutation<TVariables, TData> {
  readonly #options: () => IntentMutationOptions<TVariables>
  readonly #listeners = new Set<() => void>()
  #state: IntentMutationState<TData, TVariables> = IDLE
  #call = 0

  /** `options` is read at every call, so it may return the latest render's options. */
  constructor(options: () => IntentMutationOptions<TVariables>) {
    this.#options = options
  }

  readonly getState = (): IntentMutationState<TData, TVariables> => this.#state

  readonly subscribe = (listener: () => void): (() => void) => {
    this.#listeners.add(listener)
    return () => this.#listeners.delete(listener)
  }

  /** Forgets the latest call's state. A call still running goes on (its intent is not cancelled). */
  readonly reset = (): void => {
    this.#call++
    this.#publish(IDLE)
  }

  /** Like {@link mutateAsync}, for event handlers: the outcome is only in the state, never thrown. */
  readonly mutate = (variables: TVariables, options?: MutateOptions): void => {
    this.mutateAsync(variables, options).catch(() => {})
  }

  /** Starts one intent with `variables` as its JSON body; resolves with the response or rejects with the error. */
  readonly mutateAsync = async (
    variables: TVariables,
    options: MutateOptions = {},
  ): Promise<OncelyResponse<TData>> => {
    const call = ++this.#call
    const { client, intentId, ...definition } = this.#options()
    let current: IntentMutationState<TData, TVariables> = {
      status: 'pending',
      variables,
      intentId: undefined,
      key: undefined,
      attempts: 0,
      nextRetryAt: undefined,
      retryReason: undefined,
    }
    const update = (next: IntentMutationState<TData, TVariables>) => {
      current = next
      if (call === this.#call) this.#publish(next)
    }
    const patch = (
      changes: Partial<Extract<IntentMutationState<TData, TVariables>, { status: 'pending' }>>,
    ) => {
      if (current.status === 'pending') update({ ...current, ...changes })
    }
    update(current)
    let id: string | undefined
    let resumable = false
    const unsubscribe = [
      client.on('attempt', (event) => {
        if (event.id === id)
          patch({ attempts: event.attempt, nextRetryAt: undefined, retryReason: undefined })
      }),
      client.on('retry', (event) => {
        if (event.id === id) {
          patch({
            attempts: event.attempt,
            nextRetryAt: Date.now() + event.delayMs,
            retryReason: event.reason,
          })
        }
      }),
      client.on('failed', (event) => {
        if (event.id === id) resumable = event.pending
      }),
    ]
    try {
      const send = client.mutation<TVariables, TData>(definition)
      const response = await send(variables, {
        intentId: intentId?.(variables),
        ...(options.signal ? { signal: options.signal } : {}),
        onIntent: (intent) => {
          id = intent.id
          patch({ intentId: intent.id, key: intent.key })
        },
      })
      update({
        status: 'settled',
        variables,
        intentId: response.intentId,
        key: response.key,
        attempts: response.attempts,
        response,
        data: response.data,
        replayed: response.replayed,
      })
      return response
    } catch (error) {
      update({
        status: 'failed',
        variables,
        intentId: id,
        key: current.key,
        attempts: current.attempts,
        error: error instanceof Error ? error : new Error(String(error)),
        // Aborted after the intent was written: it stays pending (the client emits no `failed` event for that).
        resumable: resumable || (id !== undefined && options.signal?.aborted === true),
      })
      throw error
    } finally {
      for (const off of unsubscribe) off()
    }
  }

  #publish(state: IntentMutationState<TData, TVariables>): void {
    this.#state = state
    for (const listener of this.#listeners) listener()
  }
}

/** Validates a mutation's options, throwing a TypeError that names the bad one. */
export function checkMutationOptions<TVariables>(options: IntentMutationOptions<TVariables>): void {
  assertClient(options.client, 'client')
  if (typeof options.path !== 'string') {
    throw new TypeError(`Expected \`path\` to be a string, got ${String(options.path)}`)
  }
  if (options.intentId !== undefined && typeof options.intentId !== 'function') {
    throw new TypeError(
      `Expected \`intentId\` to be a function of the variables, got ${String(options.intentId)}`,
    )
  }
}
