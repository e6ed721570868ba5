import type { ClientEvents, OncelyClient, PendingIntent } from '@oncely/client'
import { useSyncExternalStore } from 'react'
import { useOncelyClient } from './context.js'

/** What {@link usePendingIntents} returns. */
export interface PendingIntentsView {
  /** Intents not confirmed yet, oldest first: pending, or expired with an unknown outcome (see `client.discard`). */
  intents: readonly PendingIntent[]
  /** True until the store has been read once (and always during server rendering). */
  isLoading: boolean
  /** The error of the last read of the store (a `StorageError`), or `undefined` once a read succeeds. */
  error: unknown
}

/** Options of {@link usePendingIntents}. */
export interface UsePendingIntentsOptions {
  /**
   * The client whose store to watch.
   * @default the nearest OncelyProvider's client
   * @example client: createClient({ baseUrl: 'https://api.example.com' })
   */
  client?: OncelyClient
}

// Client events after which the store holds something new: each is emitted once the store write it reports is done.
const CHANGES: readonly (keyof ClientEvents)[] = [
  'attempt',
  'retry',
  'settled',
  'failed',
  'expired',
  'resumed',
]
// Tabs of one origin share their IndexedDB store; this channel tells the others to read it again.
const CHANNEL = 'oncely:intents'
const LOADING: PendingIntentsView = Object.freeze({
  intents: Object.freeze([]),
  isLoading: true,
  error: undefined,
})

/**
 * One client's pending intents, read from its store: again after each of this tab's changes (and then announced on
 * a BroadcastChannel), after another tab's announcement, and when the page becomes visible. Reads never overlap:
 * changes during a read cause one more read after it. Runs while anything retains it.
 */
class IntentSync {
  readonly #client: OncelyClient
  readonly #listeners = new Set<() => void>()
  #view = LOADING
  #retained = 0
  #stop: (() => void) | undefined
  #channel: BroadcastChannel | undefined
  #reading = false
  #again: 'read' | 'announce' | undefined

  constructor(client: OncelyClient) {
    this.#client = client
  }

  readonly getView = (): PendingIntentsView => this.#view

  readonly subscribe = (listener: () => void): (() => void) => {
    this.#listeners.add(listener)
    const release = this.retain()
    return () => {
      this.#listeners.delete(listener)
      release()
    }
  }

  retain(): () => void {
    if (this.#retained++ === 0) this.#start()
    let released = false
    return () => {
      if (released) return
      released = true
      if (--this.#retained === 0) {
        this.#stop?.()
        this.#stop = undefined
      }
    }
  }

  #start(): void {
    const channel = typeof BroadcastChannel === 'function' ? new BroadcastChannel(CHANNEL) : undefined
    const announce = () => void this.#read(true)
    const reread = () => void this.#read(false)
    const unsubscribe = CHANGES.map((event) => this.#client.on(event, announce))
    channel?.addEventListener('message', reread)
    const doc = typeof document === 'undefined' ? undefined : document
    const onVisible = () => {
      if (doc?.visibilityState === 'visible') reread()
    }
    doc?.addEventListener?.('visibilitychange', onVisible)
    this.#channel = channel
    this.#stop = () => {
      for (const off of unsubscribe) off()
      channel?.close()
      this.#channel = undefined
      doc?.removeEventListener?.('visibilitychange', onVisible)
    }
    reread()
  }

  // Reads the store (after the client's own deferred writes: `pending()` waits for them) and publishes the result;
  // with `announce`, then tells the other tabs, so they read after this tab's writes are done.
  async #read(announce: boolean): Promise<void> {
    if (this.#reading) {
      if (announce || !this.#again) this.#again = announce ? 'announce' : 'read'
      return
    }
    this.#reading = true
    try {
      let next: PendingIntentsView
      try {
        const intents = (await this.#client.pending()).sort((a, b) => a.createdAt - b.createdAt)
        const same = JSON.stringify(intents) === JSON.stringify(this.#view.intents)
        next = {
          intents: same ? this.#view.intents : Object.freeze(intents),
          isLoading: false,
          error: undefined,
        }
      } catch (error) {
        next = { intents: this.#view.intents, isLoading: false, error }
      }
      if (
        next.intents !== this.#view.intents ||
        next.isLoading !== this.#view.isLoading ||
        next.error !== this.#view.error
      ) {
        this.#view = next
        for (const listener of this.#listeners) listener()
      }
      if (announce) this.#channel?.postMessage('changed')
    } finally {
      this.#reading = false
    }
    const again = this.#again
    this.#again = undefined
    if (again && this.#stop) await this.#read(again === 'announce')
  }
}

const syncs = new WeakMap<OncelyClient, IntentSync>()

function syncOf(client: OncelyClient): IntentSync {
  let sync = syncs.get(client)
  if (!sync) {
    sync = new IntentSync(client)
    syncs.set(client, sync)
  }
  return sync
}

/** Keeps `client`'s pending view up to date and announced to other tabs until the returned function is called. */
export function retainIntentSync(client: OncelyClient): () => void {
  return syncOf(client).retain()
}

/**
 * The client's pending intents, live: updated after every attempt, retry and outcome in this tab, when another tab
 * of this origin changes the same store (announced through a BroadcastChannel by tabs that render an
 * `OncelyProvider` or this hook), and when the page becomes visible. Reading the store is the only thing it does;
 * nothing is sent.
 *
 * @example
 * const { intents, isLoading } = usePendingIntents()
 * return <p role="status">{isLoading ? 'Checking…' : `${intents.length} payment(s) waiting to be confirmed`}</p>
 */
export function usePendingIntents(options: UsePendingIntentsOptions = {}): PendingIntentsView {
  const sync = syncOf(useOncelyClient(options.client))
  return useSyncExternalStore(sync.subscribe, sync.getView, getServerView)
}

function getServerView(): PendingIntentsView {
  return LOADING
}
