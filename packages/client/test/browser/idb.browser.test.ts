import { afterEach, describe, expect, it, vi } from 'vitest'
import {
  createClient,
  type IntentRecord,
  isQuotaExceededError,
  isRetryExhaustedError,
  isStorageError,
  type StoreEvents,
} from '../../src/index.js'
import { indexedDbStore } from '../../src/stores/idb.js'

let dbCount = 0
const freshName = () => `oncely-test-${Date.now()}-${dbCount++}`

const record = (id: string): IntentRecord => ({
  format: 1,
  id,
  key: `key-${id}`,
  method: 'POST',
  url: 'http://api.test/v1/payments',
  headers: {},
  createdAt: 1,
  expiresAt: Date.now() + 60_000,
  attempts: 0,
  version: 1,
  state: 'pending',
})

/** A fetch that records requests and answers from a script; `fail` simulates Chrome's network error. */
function scriptedFetch(answers: ('fail' | number)[]) {
  const seen: { key: string | null; attempt: string | null; body: string }[] = []
  const fetch = async (url: string | URL | Request, init?: RequestInit) => {
    const headers = new Headers(init?.headers)
    seen.push({
      key: headers.get('idempotency-key'),
      attempt: headers.get('oncely-attempt'),
      body: String(init?.body),
    })
    const answer = answers.shift() ?? 201
    if (answer === 'fail') throw new TypeError('Failed to fetch')
    return new Response(JSON.stringify({ url: String(url) }), {
      status: answer,
      headers: { 'content-type': 'application/json' },
    })
  }
  return { fetch: fetch as typeof globalThis.fetch, seen }
}

afterEach(() => {
  vi.restoreAllMocks()
})

describe('indexedDbStore in Chromium', () => {
  it('keeps intents across a closed connection and a new client, and resume() sends them with the same key', async () => {
    const name = freshName()
    const first = scriptedFetch(['fail'])
    const a = createClient({
      baseUrl: 'http://api.test',
      store: indexedDbStore({ name }),
      fetch: first.fetch,
      retry: { limit: 0 },
      resumeOnOnline: false,
    })
    const error = await a.request({ path: '/v1/payments', json: { amount: 7 } }).catch((e) => e)
    expect(isRetryExhaustedError(error)).toBe(true)
    await a.close()

    const second = scriptedFetch([201])
    const b = createClient({
      baseUrl: 'http://api.test',
      store: indexedDbStore({ name }),
      fetch: second.fetch,
      resumeOnOnline: false,
    })
    const [pending] = await b.pending()
    expect(pending).toMatchObject({
      key: first.seen[0]!.key,
      attempts: 1,
      lastError: { name: 'NetworkError' },
    })
    const [outcome] = await b.resume()
    expect(outcome).toMatchObject({
      outcome: 'settled',
      key: first.seen[0]!.key,
      response: { status: 201, attempts: 2 },
    })
    expect(second.seen).toEqual([{ key: first.seen[0]!.key, attempt: '2', body: '{"amount":7}' }])
    expect(await b.pending()).toEqual([])
    await b.close()
  })

  it('flushes only the write-ahead record: writes with { durable: false } (counters, outcomes, deletes) are relaxed', async () => {
    const spy = vi.spyOn(IDBDatabase.prototype, 'transaction')
    const used = () =>
      spy.mock.calls
        .filter(([, mode]) => mode === 'readwrite')
        .map(([, , options]) => (options as IDBTransactionOptions | undefined)?.durability)
    const store = indexedDbStore({ name: freshName() })
    await store.set(record('a'))
    await store.set({ ...record('a'), attempts: 1, version: 2 }, { durable: false })
    await store.delete('a', { durable: false })
    await store.set(record('b'))
    await store.delete('b')
    expect(used()).toEqual(['strict', 'relaxed', 'relaxed', 'strict', 'strict'])
    expect(await store.list()).toEqual([])

    spy.mockClear()
    const { fetch } = scriptedFetch([201])
    const client = createClient({ baseUrl: 'http://api.test', store, fetch, resumeOnOnline: false })
    await client.request({ path: '/v1/payments', json: {} })
    await client.close()
    expect(used()).toEqual(['strict', 'relaxed']) // the write-ahead record, then the delete after the answer
  })

  it('commits each write at once instead of waiting for its request to succeed first (one round trip less)', async () => {
    const commit = vi.spyOn(IDBTransaction.prototype, 'commit')
    const store = indexedDbStore({ name: freshName() })
    await store.set(record('a'))
    await store.set({ ...record('a'), attempts: 1, version: 2 }, { durable: false })
    await store.delete('a', { durable: false })
    expect(commit).toHaveBeenCalledTimes(3)
    expect(await store.list()).toEqual([])
    await store.close?.()
  })

  it('reopens after another tab upgrades the database (the browser closes this connection)', async () => {
    const name = freshName()
    const store = indexedDbStore({ name })
    await store.set(record('a'))
    const upgrade = indexedDB.open(name, 2)
    await new Promise((resolve, reject) => {
      upgrade.onsuccess = resolve
      upgrade.onerror = reject
    })
    upgrade.result.close()
    expect((await store.get('a'))?.id).toBe('a')
    await store.close?.()
  })

  it('lets one tab at a time drive an intent with Web Locks, and leaves tabs apart without them', async () => {
    const name = freshName()
    const a = indexedDbStore({ name })
    const b = indexedDbStore({ name })
    let release!: () => void
    const held = a.exclusive!('i1', () => new Promise<string>((resolve) => (release = () => resolve('a'))))
    // Wait until a's section runs (it then holds the intent's Web Lock), not for a fixed time.
    await vi.waitFor(() => expect(release).toBeDefined())
    expect(await b.exclusive!('i1', async () => 'b')).toEqual({ acquired: false })
    release()
    expect(await held).toEqual({ acquired: true, value: 'a' })
    expect(await b.exclusive!('i1', async () => 'b')).toEqual({ acquired: true, value: 'b' })
    // Without Web Locks (Safari before 15.4) nothing keeps tabs apart; the server's key check does.
    Object.defineProperty(navigator, 'locks', { value: undefined, configurable: true })
    try {
      const first = a.exclusive!('i2', () => new Promise<string>((resolve) => (release = () => resolve('a'))))
      expect(await b.exclusive!('i2', async () => 'b')).toEqual({ acquired: true, value: 'b' })
      release()
      await first
    } finally {
      // Remove the own-property shadow so the prototype's getter is visible again.
      delete (navigator as { locks?: unknown }).locks
    }
  })

  it('writes a new intent in one transaction with no per-intent Web Lock, its tab owning it while it drives it', async () => {
    const name = freshName()
    const transaction = vi.spyOn(IDBDatabase.prototype, 'transaction')
    const request = vi.spyOn(LockManager.prototype, 'request')
    const { fetch } = scriptedFetch([201, 201, 201])
    const client = createClient({
      baseUrl: 'http://api.test',
      store: indexedDbStore({ name }),
      fetch,
      resumeOnOnline: false,
    })
    for (let i = 0; i < 3; i++) await client.request({ path: '/v1/payments', json: { i } })
    const writes = transaction.mock.calls
      .filter(([, mode]) => mode === 'readwrite')
      .map(([, , options]) => (options as IDBTransactionOptions | undefined)?.durability)
    expect(writes).toEqual(['strict', 'relaxed', 'strict', 'relaxed', 'strict', 'relaxed']) // write-ahead, delete
    expect(request.mock.calls.map(([lock]) => String(lock))).toEqual([
      expect.stringMatching(/^oncely:.*:owner:/),
    ])
    await client.close()

    // While its creator drives it, another store (as another tab would) does not; once it let go, it may.
    const creator = indexedDbStore({ name })
    const other = indexedDbStore({ name })
    let release!: () => void
    const driving = creator.create!(
      record('owned'),
      () => new Promise<void>((resolve) => (release = resolve)),
    )
    // Wait until the creator drives it (its record written, its owner Web Lock held), not for a fixed time.
    await vi.waitFor(() => expect(release).toBeDefined())
    expect(await other.exclusive!('owned', async () => 'other')).toEqual({ acquired: false })
    release()
    await driving
    expect(await other.exclusive!('owned', async () => 'other')).toEqual({ acquired: true, value: 'other' })

    // A creator whose tab is gone (its owner Web Lock released) no longer keeps others out.
    const gone = indexedDbStore({ name })
    void gone.create!(record('orphan'), () => new Promise<void>(() => {}))
    await vi.waitFor(async () => expect(await other.get('orphan')).toBeDefined())
    expect(await other.exclusive!('orphan', async () => 'other')).toEqual({ acquired: false })
    await gone.close?.()
    expect(await other.exclusive!('orphan', async () => 'other')).toEqual({ acquired: true, value: 'other' })
    for (const store of [creator, other]) await store.close?.()
  })

  it('reports a lost claim like fileStore: a stolen Web Lock emits claim-lost and fails the section once it settled', async () => {
    const name = freshName()
    for (const kind of ['exclusive', 'create'] as const) {
      const store = indexedDbStore({ name })
      const events: StoreEvents['claim-lost'][] = []
      store.attach?.((event, payload) => {
        if (event === 'claim-lost') events.push(payload as StoreEvents['claim-lost'])
      })
      let release!: () => void
      const section = () => new Promise<string>((resolve) => (release = () => resolve('done')))
      const id = `${kind}-1`
      const held = kind === 'exclusive' ? store.exclusive!(id, section) : store.create!(record(id), section)
      held.catch(() => {})
      // Wait until the section runs, so its Web Lock is held and can be found below.
      await vi.waitFor(() => expect(release).toBeDefined())
      const lockName = (await navigator.locks.query())
        .held!.map((lock) => lock.name!)
        .find((lockName) =>
          kind === 'exclusive' ? lockName.endsWith(`:${id}`) : lockName.includes(':owner:'),
        )!
      await navigator.locks.request(lockName, { steal: true }, async () => {})
      await vi.waitFor(() => expect(events).toHaveLength(1))
      expect(events[0]).toMatchObject({ store: 'indexedDb', id })
      release()
      const error = await held.then(
        () => undefined,
        (reason: unknown) => reason,
      )
      expect(isStorageError(error)).toBe(true)
      expect((error as Error).message).toMatch(/lost its claim/)
      await store.close?.()
    }
  })

  it('names every bad option in one TypeError', () => {
    expect(() => indexedDbStore({ durability: 'fast' as never, fallback: 'nope' as never })).toThrow(
      /indexedDbStore: 2 invalid options.*`durability`.*`fallback`/,
    )
  })

  it('refuses the removed leaseMs option, naming the fix', () => {
    expect(() => indexedDbStore({ leaseMs: 10_000 } as never)).toThrow(
      /`leaseMs` was removed.*remove the option/,
    )
  })

  it('falls back to memory with an event when IndexedDB cannot be opened, or fails closed when asked', async () => {
    vi.spyOn(indexedDB, 'open').mockImplementation(() => {
      throw new DOMException(
        'A mutation operation was attempted on a database that did not allow mutations.',
        'InvalidStateError',
      )
    })
    const events: StoreEvents['storage-fallback'][] = []
    const { fetch, seen } = scriptedFetch([201])
    const client = createClient({
      baseUrl: 'http://api.test',
      store: indexedDbStore({ name: freshName() }),
      fetch,
      resumeOnOnline: false,
    })
    client.on('storage-fallback', (event) => events.push(event))
    const res = await client.request({ path: '/v1/payments', json: {} })
    expect(res.status).toBe(201)
    expect(seen).toHaveLength(1)
    expect(events).toEqual([
      expect.objectContaining({ store: 'indexedDb', reason: expect.stringContaining('InvalidStateError') }),
    ])

    const closed = createClient({
      baseUrl: 'http://api.test',
      store: indexedDbStore({ name: freshName(), fallback: 'fail' }),
      fetch,
      resumeOnOnline: false,
    })
    const error = await closed.request({ path: '/v1/payments', json: {} }).catch((e) => e)
    expect(isStorageError(error)).toBe(true)
    expect(seen).toHaveLength(1) // nothing sent without a record
  })

  it('surfaces QuotaExceededError and sends nothing', async () => {
    const name = freshName()
    const store = indexedDbStore({ name })
    await store.list() // open first, so only the write fails
    vi.spyOn(IDBObjectStore.prototype, 'put').mockImplementation(() => {
      throw new DOMException('The quota has been exceeded.', 'QuotaExceededError')
    })
    const { fetch, seen } = scriptedFetch([201])
    const client = createClient({ baseUrl: 'http://api.test', store, fetch, resumeOnOnline: false })
    const error = await client.request({ path: '/v1/payments', json: {} }).catch((e) => e)
    expect(isQuotaExceededError(error)).toBe(true)
    expect(seen).toHaveLength(0)
  })

  it('resumes pending intents on online and visibilitychange, and close() removes the listeners', async () => {
    const name = freshName()
    const store = indexedDbStore({ name })
    await store.set(record('offline-1'))
    const { fetch, seen } = scriptedFetch([201, 201, 201])
    const client = createClient({ baseUrl: 'http://api.test', store, fetch })
    window.dispatchEvent(new Event('online'))
    await vi.waitFor(() => expect(seen).toHaveLength(1))
    expect(seen[0]!.key).toBe('key-offline-1')
    // A page coming back to the foreground is another chance (background tabs may have been frozen).
    await store.set(record('hidden-1'))
    Object.defineProperty(document, 'visibilityState', { value: 'visible', configurable: true })
    document.dispatchEvent(new Event('visibilitychange'))
    await vi.waitFor(() => expect(seen).toHaveLength(2))
    expect(seen[1]!.key).toBe('key-hidden-1')
    await client.close()
    const again = indexedDbStore({ name })
    await again.set(record('offline-2'))
    window.dispatchEvent(new Event('online'))
    document.dispatchEvent(new Event('visibilitychange'))
    await new Promise((resolve) => setTimeout(resolve, 100))
    expect(seen).toHaveLength(2)
    await again.close?.()
  })
})
