import { performance } from 'node:perf_hooks'
import type { ResolvedStore } from '../store/postgres-store.js'
import { reapBatch } from '../store/shards.js'
import type { EngineEvents } from './events.js'
import { positiveInteger } from './options.js'
import type { Engine, ReaperOptions, ReapOptions } from './types.js'

/** The engine's `reap` (expired records, in batches) and `startReaper` (reap on an interval). */
export function reaper<Tx>(
  store: ResolvedStore<Tx>,
  events: EngineEvents,
): Pick<Engine<Tx>, 'reap' | 'startReaper'> {
  async function reap(reapOptions: ReapOptions = {}): Promise<number> {
    const batchSize = positiveInteger('batchSize', reapOptions.batchSize ?? 1_000)
    const maxBatches = positiveInteger('maxBatches', reapOptions.maxBatches ?? 100)
    const started = performance.now()
    let total = 0
    try {
      for (let batch = 0; batch < maxBatches; batch++) {
        const deleted = await reapBatch(store, batchSize)
        total += deleted
        if (deleted < batchSize) break
      }
    } catch (error) {
      events.signal({ type: 'reaped', deleted: total, durationMs: performance.now() - started, error })
      throw error
    }
    events.signal({ type: 'reaped', deleted: total, durationMs: performance.now() - started })
    return total
  }

  function startReaper(reaperOptions: ReaperOptions = {}): () => void {
    const intervalMs = positiveInteger('intervalMs', reaperOptions.intervalMs ?? 60_000)
    let running = false
    const timer = setInterval(() => {
      if (running) return
      running = true
      reap(reaperOptions)
        .catch((error) => events.emit?.({ type: 'store_error', error }))
        .finally(() => {
          running = false
        })
    }, intervalMs)
    timer.unref?.()
    return () => clearInterval(timer)
  }

  return { reap, startReaper }
}
