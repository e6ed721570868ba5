import { spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdtemp, readdir, readFile, rm, utimes, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { type IntentRecord, type IntentStore, memoryStore, type StoreEvents } from '../src/index.js'
import { asyncStorageStore } from '../src/stores/async-storage.js'
import { fileStore } from '../src/stores/node.js'

const dirs: string[] = []
afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true })
})
async function tempDir() {
  const dir = await mkdtemp(join(tmpdir(), 'oncely-store-'))
  dirs.push(dir)
  return dir
}

function fakeAsyncStorage() {
  const items = new Map<string, string>()
  return {
    items,
    getItem: async (key: string) => items.get(key) ?? null,
    setItem: async (key: string, value: string) => {
      items.set(key, value)
    },
    removeItem: async (key: string) => {
      items.delete(key)
    },
  }
}

const record = (id: string, patch: Partial<IntentRecord> = {}): IntentRecord => ({
  format: 1,
  id,
  key: `key-${id}`,
  method: 'POST',
  url: 'http://api.test/v1/payments',
  body: { encoding: 'base64', data: 'AP8K' },
  headers: { 'content-type': 'application/octet-stream' },
  createdAt: 1,
  expiresAt: 2,
  attempts: 0,
  version: 1,
  state: 'pending',
  ...patch,
})

const factories: [string, () => Promise<IntentStore>][] = [
  ['memoryStore', async () => memoryStore()],
  ['fileStore', async () => fileStore({ dir: await tempDir() })],
  ['asyncStorageStore', async () => asyncStorageStore(fakeAsyncStorage())],
]

describe.each(factories)('%s contract', (_name, create) => {
  it('sets, gets, replaces, lists and deletes records, with ids of any characters', async () => {
    const store = await create()
    expect(await store.get('missing')).toBeUndefined()
    const odd = 'checkout:cart/42?x=ü 🙂'
    await Promise.all([store.set(record('a')), store.set(record(odd)), store.set(record('c'))])
    await store.set(record('a', { attempts: 3, version: 2 }))
    expect(await store.get('a')).toEqual(record('a', { attempts: 3, version: 2 }))
    expect(await store.get(odd)).toEqual(record(odd))
    expect((await store.list()).map((r) => r.id).sort()).toEqual(['a', 'c', odd].sort())
    await store.delete('c')
    await store.delete('never-there')
    expect((await store.list()).map((r) => r.id).sort()).toEqual(['a', odd].sort())
  })

  it('returns copies: mutating a returned record does not change the store', async () => {
    const store = await create()
    await store.set(record('a'))
    const got = (await store.get('a'))!
    got.attempts = 99
    expect((await store.get('a'))!.attempts).toBe(0)
  })
})

describe('fileStore', () => {
  it('quarantines a corrupt file with an event instead of crashing, and ignores leftover temp files', async () => {
    const dir = await tempDir()
    const store = fileStore({ dir })
    const events: StoreEvents['quarantined'][] = []
    store.attach?.((event, payload) => {
      if (event === 'quarantined') events.push(payload as StoreEvents['quarantined'])
    })
    await store.set(record('good'))
    const [file] = (await readdir(dir)).filter((name) => name.endsWith('.json'))
    await writeFile(join(dir, 'torn.json'), '{"format":1,"id":"x"') // a torn write from a foreign tool
    await writeFile(join(dir, `${file}.123.abcd.tmp`), 'half') // a crash mid-write leaves only a temp file
    expect((await store.list()).map((r) => r.id)).toEqual(['good'])
    expect(events).toEqual([
      expect.objectContaining({
        store: 'file',
        reason: expect.stringContaining('not a chain of records'),
        location: expect.stringContaining('quarantine'),
      }),
    ])
    expect(await readFile(events[0]!.location, 'utf8')).toBe('{"format":1,"id":"x"')
    expect(await store.get('good')).toEqual(record('good'))
  })

  it('lets one process at a time drive an intent, and takes over a claim whose process is gone', async () => {
    const dir = await tempDir()
    const a = fileStore({ dir })
    const b = fileStore({ dir })
    let release!: () => void
    let entered!: () => void
    const inside = new Promise<void>((resolve) => {
      entered = resolve
    })
    const held = a.exclusive!('i1', () => {
      entered()
      return new Promise<string>((resolve) => (release = () => resolve('a')))
    })
    await inside // a holds the claim now, whatever the machine's load
    expect(await b.exclusive!('i1', async () => 'b')).toEqual({ acquired: false })
    release()
    expect(await held).toEqual({ acquired: true, value: 'a' })
    expect(await b.exclusive!('i1', async () => 'b')).toEqual({ acquired: true, value: 'b' })
    // A fresh lock left by a process that no longer exists (SIGKILLed) is taken over at once.
    const deadPid = spawnSync(process.execPath, ['-e', '0']).pid
    const lock = join(dir, `${createHash('sha256').update('i1').digest('hex').slice(0, 40)}.lock`)
    await writeFile(lock, JSON.stringify({ pid: deadPid, until: Date.now() + 60_000 }))
    expect(await b.exclusive!('i1', async () => 'b')).toEqual({ acquired: true, value: 'b' })
    await writeFile(lock, JSON.stringify({ pid: process.pid, until: Date.now() + 60_000 }))
    expect(await b.exclusive!('i1', async () => 'b')).toEqual({ acquired: false })
  })

  // Regression (found by the chaos suite, seed 5): a worker SIGKILLed between creating its lock file and writing
  // it left an empty lock, and every later resume() of that intent threw "Unexpected end of JSON input" forever.
  it('treats an empty or torn lock file as held while fresh and as stale once older than the lease', async () => {
    const dir = await tempDir()
    const store = fileStore({ dir, leaseMs: 1_000 })
    const lock = join(dir, `${createHash('sha256').update('i2').digest('hex').slice(0, 40)}.lock`)
    await writeFile(lock, '')
    expect(await store.exclusive!('i2', async () => 'x')).toEqual({ acquired: false })
    await writeFile(lock, '{"pid":')
    expect(await store.exclusive!('i2', async () => 'x')).toEqual({ acquired: false })
    const old = new Date(Date.now() - 5_000)
    await utimes(lock, old, old)
    expect(await store.exclusive!('i2', async () => 'x')).toEqual({ acquired: true, value: 'x' })
  })
})

describe('store options', () => {
  it('name every bad option of a store in one TypeError', () => {
    expect(() => fileStore({ dir: '', leaseMs: -1 })).toThrow(
      /fileStore: 2 invalid options.*`dir`.*`leaseMs`/,
    )
    expect(() => asyncStorageStore({} as never, { prefix: 1 as never })).toThrow(
      /asyncStorageStore: 4 invalid options.*`storage.getItem`.*`prefix`/,
    )
  })
})

describe('asyncStorageStore', () => {
  // Regression: it ignored `{ durable: false }` and rewrote the index for every attempt counter, outcome and
  // delete after an answer, three storage calls where one does.
  it('honours { durable: false }: later versions and the delete after an answer touch only the item', async () => {
    const storage = fakeAsyncStorage()
    const calls: string[] = []
    const counted = {
      getItem: (key: string) => {
        calls.push(`get ${key}`)
        return storage.getItem(key)
      },
      setItem: (key: string, value: string) => {
        calls.push(`set ${key}`)
        return storage.setItem(key, value)
      },
      removeItem: (key: string) => {
        calls.push(`remove ${key}`)
        return storage.removeItem(key)
      },
    }
    const store = asyncStorageStore(counted)
    await store.set(record('a'))
    await store.set(record('b'))
    calls.length = 0
    await store.set(record('a', { attempts: 1, version: 2 }), { durable: false })
    await store.delete('a', { durable: false })
    expect(calls).toEqual(['set oncely:intent:a', 'remove oncely:intent:a'])
    expect((await store.list()).map((r) => r.id)).toEqual(['b'])
    // The next durable write of the index drops the id whose item is gone.
    await store.set(record('c'))
    expect(JSON.parse(storage.items.get('oncely:index')!)).toEqual(['b', 'c'])
  })

  it('keeps an index item and one item per intent, and quarantines a corrupt item', async () => {
    const storage = fakeAsyncStorage()
    const store = asyncStorageStore(storage)
    const events: unknown[] = []
    store.attach?.((_event, payload) => events.push(payload))
    await store.set(record('a'))
    await store.set(record('b'))
    expect(JSON.parse(storage.items.get('oncely:index')!)).toEqual(['a', 'b'])
    storage.items.set('oncely:intent:b', 'garbage')
    expect((await store.list()).map((r) => r.id)).toEqual(['a'])
    expect(storage.items.get('oncely:quarantine:b')).toBe('garbage')
    expect(JSON.parse(storage.items.get('oncely:index')!)).toEqual(['a'])
    expect(events).toHaveLength(1)
  })
})
