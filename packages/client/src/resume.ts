import type { Driver } from './driver.js'
import type { IntentRecord } from './intent.js'
import type { ResolvedOptions } from './options.js'
import { mapLimit } from './pool.js'
import type { OncelyResponse } from './response.js'

/** One intent's result from `client.resume()`. */
export type ResumeOutcome =
  | { id: string; key: string; outcome: 'settled'; response: OncelyResponse }
  | { id: string; key: string; outcome: 'failed'; error: unknown }
  | { id: string; key: string; outcome: 'skipped'; reason: 'busy' | 'not-pending' }

/**
 * Re-drives every pending intent with its original key and bytes, oldest first and at most `resumeConcurrency` at
 * a time (thousands of intents left by an outage must not arrive as one burst), and deletes the recorded outcomes
 * whose `settledTtlMs` is over.
 */
export async function resume(driver: Driver, resolved: ResolvedOptions): Promise<ResumeOutcome[]> {
  const { store, timers } = driver.ctx
  await driver.drained()
  const records = (await store.list()).sort((a, b) => a.createdAt - b.createdAt)
  const now = timers.now()
  const outcomes = await mapLimit(
    records,
    resolved.resumeConcurrency,
    async (record): Promise<ResumeOutcome | undefined> => {
      if (record.state === 'settled' || record.state === 'failed') {
        if ((record.keepUntil ?? 0) <= now) await forget(driver, record, now)
        return undefined
      }
      if (record.state === 'expired') return undefined
      const base = { id: record.id, key: record.key }
      // Who awaits a resume() started on `online` or at start? Nobody: the `resumed` event tells the app.
      const target = { method: record.method, url: record.url }
      let result: Awaited<ReturnType<Driver['driveStored']>>
      try {
        result = await driver.track(record.id, undefined, () =>
          driver.driveStored(record.id, {}, undefined, false),
        )
      } catch (error) {
        driver.ctx.events.emit('resumed', { ...base, ...target, outcome: 'failed', error })
        return { ...base, outcome: 'failed', error }
      }
      if ('skipped' in result) return { ...base, outcome: 'skipped', reason: result.skipped }
      driver.ctx.events.emit('resumed', { ...base, ...target, outcome: 'settled', response: result })
      return { ...base, outcome: 'settled', response: result }
    },
  )
  return outcomes.filter((outcome): outcome is ResumeOutcome => outcome !== undefined)
}

// Deletes a recorded outcome that is no longer kept. Under the intent's claim, and only if it is still that
// outcome: another call with the same intentId may have written a new intent under the same id meanwhile. A
// failure or a busy claim leaves it to the next resume().
async function forget(driver: Driver, seen: IntentRecord, now: number): Promise<void> {
  const { store } = driver.ctx
  await driver
    .exclusive(seen.id, async () => {
      const current = await store.get(seen.id)
      const stale =
        current &&
        (current.state === 'settled' || current.state === 'failed') &&
        (current.keepUntil ?? 0) <= now
      if (stale) await store.delete(seen.id, { durable: false })
    })
    .catch(() => {})
}
