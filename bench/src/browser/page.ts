// Runs inside Chromium (bundled by suites/client-browser.ts with esbuild): the timed loops live in the page, so
// every latency is the page's own `performance.now()` around one mutation and no DevTools round trip is counted.
import { createClient, type OncelyClient } from '@oncely/client'
import { indexedDbStore } from '@oncely/client/idb'
import { LEDGER_BODY, ledgerIntent } from '../intent.js'

export type BrowserSender =
  | 'fetch'
  | 'indexedDbStore relaxed'
  | 'indexedDbStore strict'
  | 'IndexedDB put relaxed'
  | 'IndexedDB put strict'
  | 'IndexedDB put strict, then fetch'

const body = LEDGER_BODY
const clients = new Map<BrowserSender, OncelyClient>()

// `fallback: 'fail'`: a store that silently fell back to memory would measure the wrong thing.
function client(durability: 'relaxed' | 'strict', name: string): OncelyClient {
  return createClient({
    baseUrl: location.origin,
    store: indexedDbStore({ name, durability, fallback: 'fail' }),
    resumeOnStart: false,
    resumeOnOnline: false,
  })
}

// The floors: one intent-sized record put in its own transaction with the given durability and committed at once,
// in a database of this page with nothing else in it. No IndexedDB store can make a mutation durable for less.
let floorDb: Promise<IDBDatabase> | undefined
function openFloorDb(): Promise<IDBDatabase> {
  floorDb ??= new Promise((resolve, reject) => {
    const request = indexedDB.open(`bench-floor-${Date.now()}`)
    request.onupgradeneeded = () => request.result.createObjectStore('floor')
    request.onsuccess = () => resolve(request.result)
    request.onerror = () => reject(request.error)
  })
  return floorDb
}
async function bareput(durability: 'relaxed' | 'strict'): Promise<void> {
  const db = await openFloorDb()
  const record = ledgerIntent(location.origin)
  await new Promise<void>((resolve, reject) => {
    const tx = db.transaction('floor', 'readwrite', { durability })
    tx.oncomplete = () => resolve()
    tx.onabort = tx.onerror = () => reject(tx.error)
    tx.objectStore('floor').put(record, record.id)
    tx.commit()
  })
}

const senders: Record<BrowserSender, () => Promise<unknown>> = {
  // The baseline: the same POST with a fresh key header and nothing persisted.
  fetch: async () => {
    const response = await fetch('/ledger', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': crypto.randomUUID() },
      body: JSON.stringify(body),
    })
    return response.json()
  },
  'indexedDbStore relaxed': () =>
    clients.get('indexedDbStore relaxed')!.request({ path: '/ledger', json: body }),
  'indexedDbStore strict': () =>
    clients.get('indexedDbStore strict')!.request({ path: '/ledger', json: body }),
  'IndexedDB put relaxed': () => bareput('relaxed'),
  'IndexedDB put strict': () => bareput('strict'),
  // A mutation made by hand with nothing but its durable write: the bare put, then the baseline's POST. Compared
  // to the baseline, what one durable write costs at the rhythm of mutations (a network round trip between puts)
  // rather than back to back.
  'IndexedDB put strict, then fetch': async () => {
    await bareput('strict')
    return senders.fetch()
  },
}

/** Sends `count` mutations one at a time with `sender` and returns each one's latency in milliseconds. */
async function timed(sender: BrowserSender, count: number): Promise<number[]> {
  if (!crossOriginIsolated) throw new Error('the bench page must be cross-origin isolated (precise timers)')
  if (sender.startsWith('indexedDbStore') && !clients.has(sender))
    clients.set(sender, client(sender === 'indexedDbStore strict' ? 'strict' : 'relaxed', `bench-${sender}`))
  const send = senders[sender]
  const latencies: number[] = []
  for (let i = 0; i < count; i++) {
    const start = performance.now()
    await send()
    latencies.push(performance.now() - start)
  }
  return latencies
}

/** Writes `intents` pending intents into a fresh strict indexedDbStore, then times one `client.resume()`. */
async function resumeTime(intents: number): Promise<{ seconds: number; settled: number }> {
  const store = indexedDbStore({ name: `bench-resume-${Date.now()}`, fallback: 'fail' })
  for (let i = 0; i < intents; i++) await store.set(ledgerIntent(location.origin, 0))
  const resumer = createClient({
    baseUrl: location.origin,
    store,
    resumeOnStart: false,
    resumeOnOnline: false,
  })
  const started = performance.now()
  const outcomes = await resumer.resume()
  const seconds = (performance.now() - started) / 1000
  await resumer.close()
  return { seconds, settled: outcomes.filter((o) => o.outcome === 'settled').length }
}

export interface BenchPage {
  timed: typeof timed
  resumeTime: typeof resumeTime
}

Object.assign(window, { oncelyBench: { timed, resumeTime } satisfies BenchPage })
