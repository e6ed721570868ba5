/**
 * Where each intent the run started stands, from the history as it is written, so the drain can wait for every one
 * of them before the ledger is read: a probe sent just before the end of the fault phase may still be retrying
 * (a crashed attempt's reservation answers 409 until its lease ends), and reading the ledger under it would report
 * its key as stuck in flight when it was only unfinished.
 *
 * Intents sent through the SDK are resumed from the workers' stores by the drain. Raw ones (the probes, the failover
 * replays, the saturation bursts) are not in any store: one that ended without a definite answer (its budget ran out,
 * or its worker died under it) is sent again while its key is still held, as a client retries what it never got an
 * answer for.
 */
import type { HistoryEvent, IntentKind } from './history.js'

export type IntentState = 'in-flight' | 'definite' | 'indefinite'

export interface TrackedIntent {
  id: string
  kind: IntentKind
  tenant: string
  /** The process that sends it (`worker-2`, or `nemesis` for the bursts). */
  process: string
  /** The idempotency key, once an event carried it. */
  key: string | undefined
  state: IntentState
  /** The highest attempt number recorded. */
  attempts: number
}

export class IntentTracker {
  readonly #intents = new Map<string, TrackedIntent>()

  /** Feeds one history event (every event may be passed; those not about intents are ignored). */
  observe(event: HistoryEvent): void {
    if (event.type === 'intent' && event.phase === 'invoke') {
      const known = this.#intents.get(event.intent)
      this.#intents.set(event.intent, {
        id: event.intent,
        kind: event.kind ?? known?.kind ?? 'normal',
        tenant: event.tenant,
        process: event.process,
        key: event.key ?? known?.key,
        state: 'in-flight',
        attempts: known?.attempts ?? 0,
      })
      return
    }
    if (event.type !== 'intent' && event.type !== 'attempt') return
    const intent = this.#intents.get(event.intent)
    if (!intent) return
    intent.key ??= event.key
    if (event.type === 'attempt') {
      intent.attempts = Math.max(intent.attempts, event.attempt)
      // Sent again: in flight once more until it ends.
      if (event.phase === 'invoke' && intent.state === 'indefinite') intent.state = 'in-flight'
      return
    }
    if (event.phase === 'ok' || event.phase === 'fail') intent.state = 'definite'
    else if (event.phase === 'info' && intent.state !== 'definite') intent.state = 'indefinite'
  }

  /** A process died: what it had in flight ended without an answer (the SDK's ones wait in its store). */
  processExited(process: string): void {
    for (const intent of this.#intents.values()) {
      if (intent.process === process && intent.state === 'in-flight') intent.state = 'indefinite'
    }
  }

  /** Intents started and not ended yet. */
  inFlight(): TrackedIntent[] {
    return [...this.#intents.values()].filter((intent) => intent.state === 'in-flight')
  }

  /** Raw intents (not through the SDK) that ended without a definite answer. */
  withoutAnswer(): TrackedIntent[] {
    return [...this.#intents.values()].filter(
      (intent) => intent.kind !== 'normal' && intent.state === 'indefinite' && intent.key !== undefined,
    )
  }

  get(id: string): TrackedIntent | undefined {
    return this.#intents.get(id)
  }
}
